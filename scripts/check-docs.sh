#!/usr/bin/env bash
# Checks the documentation's structure: every page has its Chinese translation (`X.zh.md`
# beside `X.md`), each links to the other, the translation's headings keep up with the
# English page's, and every relative link in README and docs/ points at a file that exists.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
# Every page (README and each docs/*.md) has its translation, linked both ways, whose headings
# keep up with the English page's: the same sequence of heading levels (code blocks skipped).
levels() { awk '/^```/ { code = !code; next } !code && /^#+ / { match($0, /^#+/); printf "%d ", RLENGTH }' "$1"; }
for en in README.md $(ls docs/*.md | grep -v '\.zh\.md$'); do
  zh="${en%.md}.zh.md"
  if [ ! -f "$zh" ]; then echo "missing translation: $zh (of $en)"; fail=1; continue; fi
  grep -q "($(basename "$zh"))" "$en" || { echo "$en does not link to $(basename "$zh")"; fail=1; }
  grep -q "($(basename "$en"))" "$zh" || { echo "$zh does not link to $(basename "$en")"; fail=1; }
  if [ "$(levels "$en")" != "$(levels "$zh")" ]; then
    echo "$zh: headings ($(levels "$zh" | wc -w)) differ from $en's ($(levels "$en" | wc -w)): levels [$(levels "$zh")] vs [$(levels "$en")]"
    fail=1
  fi
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
