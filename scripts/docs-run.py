#!/usr/bin/env python3
"""Runs the docs the way a newcomer reads them, so every command on the page works as written.

Markers are HTML comments on the line right before a fenced block (invisible when rendered):

* ``<!-- run -->`` — a shell block of README.md, docs/getting-started.md or docs/multi-node.md
  that this script runs. Each page's run blocks execute in order in one bash process (from the
  repository root, ``set -euo pipefail``), so a variable or a background node started by one
  block is there for the next; processes a page leaves running are stopped when it ends.
* ``<!-- not run: why -->`` — a shell block of those pages that is not run here (another CI
  stage runs it, or it needs a GPU, a NIC or other hosts). Every shell block of those pages
  carries one of the two markers, so none is skipped silently.
* ``<!-- include: path -->`` — the block is that file of the repository, byte for byte (checked
  on every page, both languages). Rust and Python programs on the pages are all included from
  files that CI compiles and runs; a Rust or Python block without this marker fails the check.
* ``<!-- sample: abridged -->`` / ``<!-- sample: abridged from docs/page.md -->`` — output
  shown on the page. Each of its lines (a line indented by four or more spaces continues the
  one before) must match a line the page's run printed (or the named page's run): its words in
  order, any number standing for any number, ``…`` for anything. ``<!-- sample: fields from
  docs/page.md -->``: the same, but a ``key=value`` word matches that key with any value (a
  sample from another deployment: its fields must be the ones printed today).
  ``<!-- sample: exact -->``: every line appears as is. A translation's samples are checked
  against its English page's run.

Usage: ``python3 scripts/docs-run.py [--check-only | --page PAGE]`` (``--check-only``:
markers, includes and their files, without running anything; ``--page``: run one page and
check the samples of its run). Exits non-zero with one line per problem.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN_PAGES = ["README.md", "docs/getting-started.md", "docs/multi-node.md"]
PAGE_TIMEOUT_S = 420
SHELL = {"bash", "sh", "shell", "console"}
PROGRAM = {"rust", "python"}
MARK = re.compile(r"^<!--\s*(run|not run|include|sample)\s*:?\s*(.*?)\s*-->$")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Block:
    def __init__(self, page, line, lang, body, mark, arg):
        self.page, self.line, self.lang, self.body = page, line, lang, body
        self.mark, self.arg = mark, arg

    def where(self):
        return f"{self.page}:{self.line}"


def blocks(page):
    """Every fenced block of a page, with the marker on the line right before its fence."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, lang, start = len(fence.group(1)), fence.group(2).lower(), i + 1
        prev = lines[i - 1].strip() if i > 0 else ""
        mark = MARK.match(prev)
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:] if not lines[i][:indent].strip() else lines[i])
            i += 1
        i += 1
        out.append(Block(page, start, lang, "\n".join(body) + "\n",
                         mark.group(1) if mark else None, mark.group(2) if mark else ""))
    return out


def all_pages():
    pages = ["README.md", "README.zh.md"]
    pages += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
    return pages


def check_static(problems):
    for page in all_pages():
        for b in blocks(page):
            if b.mark == "include":
                path = ROOT / b.arg
                if not path.is_file():
                    problems.append(f"{b.where()}: includes {b.arg}, which does not exist")
                elif path.read_text(encoding="utf-8") != b.body:
                    problems.append(f"{b.where()}: differs from {b.arg} (copy the file into the block)")
            elif b.lang in PROGRAM:
                problems.append(f"{b.where()}: a {b.lang} block must be <!-- include: path --> of a file CI runs")
            if page in RUN_PAGES and b.lang in SHELL and b.mark not in ("run", "not run"):
                problems.append(f"{b.where()}: shell block without <!-- run --> or <!-- not run: why -->")
            if b.mark == "not run" and not b.arg:
                problems.append(f"{b.where()}: <!-- not run --> needs a reason")


def sample_lines(body):
    joined = []
    for line in body.splitlines():
        if line.startswith("    ") and joined:
            joined[-1] += " " + line.strip()
        elif line.strip():
            joined.append(line.strip())
    return joined


def pattern(line, fields_only=False):
    parts = []
    for word in line.split():
        if word in ("…", "..."):
            continue
        if fields_only and re.match(r"^[a-z_]+=", word):
            parts.append(re.escape(word.split("=", 1)[0]) + r"=\S*")
            continue
        esc = re.escape(word).replace("…", ".*")
        parts.append(re.sub(r"\d+", r"\\d+", esc))
    # Words in order, whitespace and anything else between them.
    return re.compile(r"\s+(?:.*?\s)?".join(parts))


def check_sample(b, output, problems):
    kind = b.arg.split()[0] if b.arg else ""
    real = output.splitlines()
    for line in sample_lines(b.body):
        if kind == "exact":
            ok = line in (r.strip() for r in real)
        else:
            pat = pattern(line, fields_only=(kind == "fields"))
            ok = any(pat.search(r) for r in real)
        if not ok:
            problems.append(f"{b.where()}: sample line not printed by the run: {line!r}")


def run_page(page, problems):
    script = ["set -euo pipefail", f"cd {ROOT}",
              # Stop what the page left running (its nodes), then wait for them to go.
              "trap 'kill $(jobs -p) 2>/dev/null || true; wait || true' EXIT"]
    runs = [b for b in blocks(page) if b.mark == "run"]
    for b in runs:
        script.append(f"echo '::docs-block:: {b.where()}'")
        script.append(b.body)
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write("\n".join(script))
        path = f.name
    print(f"::docs-page:: {page}: {len(runs)} block(s)", flush=True)
    proc = subprocess.Popen(["bash", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, errors="replace")
    try:
        out, _ = proc.communicate(timeout=PAGE_TIMEOUT_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = "timeout"
    finally:
        os.unlink(path)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything still alive in the page's group
        except ProcessLookupError:
            pass
    out = ANSI.sub("", out)
    if rc != 0:
        last = [l for l in out.splitlines() if l.startswith("::docs-block::")]
        where = last[-1].split(" ", 1)[1] if last else page
        problems.append(f"{where}: the page's commands failed ({rc}); last lines:\n    "
                        + "\n    ".join(out.splitlines()[-25:]))
    return out


def main():
    check_only = "--check-only" in sys.argv
    only = sys.argv[sys.argv.index("--page") + 1] if "--page" in sys.argv else None
    problems = []
    check_static(problems)
    outputs = {}
    if not check_only and not problems:
        for page in [only] if only else RUN_PAGES:
            outputs[page] = run_page(page, problems)
        for page in all_pages():
            for b in blocks(page):
                if b.mark != "sample":
                    continue
                m = re.search(r"\bfrom\s+(\S+)", b.arg)
                # A translation's samples are checked against the run of its English page.
                source = m.group(1) if m else page.replace(".zh.md", ".md")
                if only and source != only:
                    continue
                if source not in outputs:
                    problems.append(f"{b.where()}: sample of {source}, which is not a run page")
                else:
                    check_sample(b, outputs[source], problems)
    for p in problems:
        print(f"docs-run: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print("docs-run: ok" + (" (checks only)" if check_only else f" (ran {', '.join(outputs)})"))


if __name__ == "__main__":
    main()
