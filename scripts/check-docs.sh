#!/usr/bin/env bash
# Checks the documentation's structure: every page that has a Chinese translation has it
# (`X.zh.md` beside `X.md`), each links to the other, and every relative link in README and
# docs/ points at a file that exists.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
for en in README.md docs/getting-started.md docs/sglang.md docs/positioning.md docs/operations.md docs/security.md docs/slotmap.md docs/pd-handoff.md docs/reliability.md docs/rdma-validation.md docs/multi-node.md docs/performance.md docs/rdma.md; do
  zh="${en%.md}.zh.md"
  if [ ! -f "$zh" ]; then echo "missing translation: $zh (of $en)"; fail=1; continue; fi
  grep -q "($(basename "$zh"))" "$en" || { echo "$en does not link to $(basename "$zh")"; fail=1; }
  grep -q "($(basename "$en"))" "$zh" || { echo "$zh does not link to $(basename "$en")"; fail=1; }
done
for f in README.md README.zh.md docs/*.md; do
  dir=$(dirname "$f")
  # Relative markdown links: ](path) or ](path#anchor), not http(s) or pure anchors.
  for link in $(grep -oE '\]\([^)#]+(#[^)]*)?\)' "$f" | sed -E 's/^\]\(([^)#]*).*/\1/' | grep -vE '^(https?:|mailto:)' || true); do
    if [ ! -e "$dir/$link" ]; then echo "$f: broken link $link"; fail=1; fi
  done
done
if [ "$fail" -ne 0 ]; then echo "documentation check failed"; exit 1; fi
echo "docs ok"
