"""The Python distributions scripts/gpu-check.sh must carry to a GPU host, found by tracing
rather than listed by hand: run inside the SGLang contract venv (scripts/sglang-venv.sh), it
imports every module the direct-linker tests and the GPU check import (their `import`
statements, those inside functions too), maps the loaded top-level modules to the
distributions that provide them, and drops those the device image already holds
(scripts/gpu-device-packages.txt) and this project's own (its wheel is built separately).

    python scripts/gpu_wheels.py            # one "name==version" per line
    python scripts/gpu_wheels.py --download DIR
        # those wheels for the device's CPython 3.12 on x86-64 Linux, into DIR (pip download
        # --no-deps --only-binary=:all:), then the total size
    python scripts/gpu_wheels.py --held
        # the other side: the distributions the sources load that the device image holds, as
        # "name==version" (the device's version where the notes read one, else this venv's);
        # scripts/gpu-rehearse.sh builds a stand-in of the device's Python from it

What travels to the device is limited (64 MiB with the working tree), and sglang's wheel alone
is 39 MB, most of it compiled extensions (its server, gRPC, benchmarks) that the traced imports
never load. So its copy in DIR is slimmed: the extension modules and the large subpackages
(``multimodal_gen``, ``test``) no traced import loaded are left out, and its RECORD with them;
``DIR/slimmed.txt`` lists what was left out. An import of one of them on the device fails with
ModuleNotFoundError naming it, never silently.

Versions are the venv's, which the contract stage tests. A distribution the device holds at
another version is printed to stderr as a note: it is not carried (torch and transformers are
the device's own), and the GPU check's report names the versions it ran with.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata as md
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "peercache-py" / "tests" / "sglang"
# What runs on the device under SGLang: the linker tests, the helpers they import, the linker
# and store adapters, and the check's own measurements.
SOURCES = [TESTS / "test_linker.py", TESTS / "test_contract.py",
           ROOT / "peercache-py" / "python" / "peercache" / "linker.py",
           ROOT / "peercache-py" / "python" / "peercache" / "store.py",
           ROOT / "scripts" / "gpu_check.py"]
DEVICE_PACKAGES = ROOT / "scripts" / "gpu-device-packages.txt"
OWN = {"peercache"}
# Import stand-ins the check puts on the device's path instead of a wheel (scripts/gpu-shims).
SHIMS = {p.name for p in (ROOT / "scripts" / "gpu-shims").iterdir() if p.is_dir()}
# manylinux tags pip matches exactly: every glibc level up to the device image's.
PLATFORMS = ([f"manylinux_2_{n}_x86_64" for n in range(17, 40)]
             + ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"])


def norm(name: str) -> str:
    """A distribution name as pip compares them."""
    return name.lower().replace("_", "-").replace(".", "-")


def device_packages() -> Dict[str, str]:
    """Name → version ("" where unknown) of what the device image holds."""
    out: Dict[str, str] = {}
    for line in DEVICE_PACKAGES.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition(" ")
            out[norm(name)] = version.strip()
    return out


def imported_names(path: Path) -> Set[str]:
    """Absolute module names ``path`` imports anywhere (module level and inside functions)."""
    names: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def trace() -> Tuple[List[Tuple[str, str]], List[str], Set[str]]:
    """(name, version) of every distribution the sources load, sorted; the modules that failed
    to import (with why); and the names of every module loaded."""
    sys.path[:0] = [str(TESTS), str(ROOT / "scripts")]
    failed: List[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(set().union(*(imported_names(p) for p in SOURCES))):
            if name.partition(".")[0] in SHIMS:
                continue
            try:
                importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 - report every failure, import the rest
                failed.append(f"{name}: {type(e).__name__}: {e}")
    providers = md.packages_distributions()
    dists: Dict[str, str] = {}
    for top in {m.partition(".")[0] for m in list(sys.modules)}:
        for dist in providers.get(top, []):
            dists[norm(dist)] = md.version(dist)
    return sorted(dists.items()), failed, set(sys.modules)


SLIM = {"sglang": ("multimodal_gen", "test")}


def slim(wheel: Path, package: str, loaded: Set[str]) -> List[str]:
    """Rewrites ``wheel`` without the extension modules of ``package`` and the subpackages
    ``SLIM[package]`` that no module in ``loaded`` comes from; the names left out."""
    def unused(name: str) -> bool:
        parts = name.split("/")
        if parts[0] != package:
            return False
        if len(parts) > 2 and parts[1] in SLIM.get(package, ()):
            return not any(m.startswith(f"{package}.{parts[1]}") for m in loaded)
        if name.endswith(".so"):
            return ".".join(parts[:-1] + [parts[-1].split(".")[0]]) not in loaded
        return False

    tmp = wheel.with_suffix(".slim")
    dropped: List[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        names = [i.filename for i in src.infolist()]
        dropped = [n for n in names if unused(n)]
        gone = set(dropped)
        for info in src.infolist():
            if info.filename in gone:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True)
                               if line.split(",")[0] not in gone).encode()
            dst.writestr(info, data)
    tmp.replace(wheel)
    return dropped


def carried(dists: List[Tuple[str, str]], device: Dict[str, str]) -> List[Tuple[str, str]]:
    """The distributions to carry: neither on the device nor this project's."""
    for name, version in dists:
        there = device.get(name)
        if there and there != version:
            print(f"gpu-wheels: note: the device has {name} {there}, the contract venv {version}; "
                  f"the device's runs", file=sys.stderr)
    return [(n, v) for n, v in dists if n not in device and n not in OWN]


def held(dists: List[Tuple[str, str]], device: Dict[str, str]) -> List[Tuple[str, str]]:
    """The distributions the sources load that the device image holds, at the device's version
    where one was read, else at this venv's."""
    return [(n, device[n] or v) for n, v in dists if n in device and n not in OWN]


def download(wanted: List[Tuple[str, str]], dest: Path, loaded: Set[str]) -> int:
    """Downloads each wanted wheel for CPython 3.12 on x86-64 Linux into ``dest`` (slimmed as
    the module says); the total bytes."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    for name, version in wanted:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                        "cp", *plat, "-d", str(dest), f"{name}=={version}"], check=True)
    left_out: List[str] = []
    for package in SLIM:
        for wheel in dest.glob(f"{package}-*.whl"):
            left_out += slim(wheel, package, loaded)
    (dest / "slimmed.txt").write_text("".join(f"{n}\n" for n in left_out))
    return sum(f.stat().st_size for f in dest.glob("*.whl"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--download", type=Path, metavar="DIR", help="download the wheels into DIR")
    what.add_argument("--held", action="store_true", help="list what the device holds instead")
    args = ap.parse_args()
    dists, failed, loaded = trace()
    if failed:
        print("gpu-wheels: these imports failed in this venv (run it in the SGLang contract venv):",
              *failed, sep="\n  ", file=sys.stderr)
        return 1
    device = device_packages()
    if args.held:
        for name, version in held(dists, device):
            print(f"{name}=={version}")
        return 0
    wanted = carried(dists, device)
    if args.download is None:
        for name, version in wanted:
            print(f"{name}=={version}")
        return 0
    total = download(wanted, args.download, loaded)
    print(f"gpu-wheels: {len(wanted)} wheels, {total / 2**20:.1f} MiB in {args.download}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
