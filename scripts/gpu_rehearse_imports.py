"""The rehearsal's import check (scripts/gpu-rehearse.sh): imports every module the GPU check and
the linker tests import, as a GPU host would, with torch pretending to see one H200.

SGLang chooses its kernels at import by asking torch for CUDA (``if _is_cuda: from sgl_kernel...``),
so on a machine without a GPU those branches never run and the ``sgl_kernel`` stand-in
(scripts/gpu-shims) is never tried. Here torch's device queries answer as an H200 would; nothing
is computed on it. Run with the carried wheels and the stand-in on ``PYTHONPATH``. Prints each
module that fails and exits 1 if one did.
"""

from __future__ import annotations

import importlib
import sys
import traceback
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_wheels  # noqa: E402

H200 = types.SimpleNamespace(name="NVIDIA H200", total_memory=140 << 30, major=9, minor=0,
                             multi_processor_count=132, L2_cache_size=60 << 20, gcnArchName="")


def pretend_cuda() -> None:
    """torch's device queries answer as one H200 would."""
    cuda = torch.cuda
    setattr(cuda, "is_available", lambda: True)
    setattr(cuda, "device_count", lambda: 1)
    setattr(cuda, "current_device", lambda: 0)
    setattr(cuda, "get_device_name", lambda device=None: H200.name)
    setattr(cuda, "get_device_capability", lambda device=None: (H200.major, H200.minor))
    setattr(cuda, "get_device_properties", lambda device=None: H200)
    setattr(cuda, "mem_get_info", lambda device=None: (H200.total_memory, H200.total_memory))


def main() -> int:
    pretend_cuda()
    sys.path.insert(0, str(gpu_wheels.TESTS))
    names = sorted(n for n in set().union(*(gpu_wheels.imported_names(p) for p in gpu_wheels.SOURCES))
                   if n.partition(".")[0] not in gpu_wheels.SHIMS)
    failed = 0
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - report every module, try the rest
            failed += 1
            print(f"gpu-rehearse: import {name} failed (pretending CUDA):", file=sys.stderr)
            traceback.print_exc(limit=-4)
    print(f"gpu-rehearse: {len(names) - failed} of {len(names)} modules import as on a CUDA host")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
