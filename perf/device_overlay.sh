#!/usr/bin/env bash
# Make device-overlay.tgz in the repo root: what turns a copy of this working tree back into HEAD (the
# committed versions of every file changed since HEAD, and device-untracked.txt listing the files git
# does not track). The GPU machine receives the working tree (64 MiB at most, with the carried wheels), so a
# whole snapshot of HEAD beside it no longer fits; perf/h200_env.sh applies the overlay to a copy instead,
# so colleagues' unfinished edits cannot leak into a measurement. Delete both files after the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -f device-overlay.tgz device-untracked.txt
changed=$(git diff --name-only HEAD --diff-filter=MD)
git ls-files -o --exclude-standard | grep -v -x -e device-overlay.tgz -e device-untracked.txt > device-untracked.txt || true
if [ -n "$changed" ]; then
  # shellcheck disable=SC2086
  git archive --format=tar.gz -o device-overlay.tgz HEAD -- $changed
else
  tar -czf device-overlay.tgz --files-from /dev/null
fi
echo "device overlay: $(echo "$changed" | grep -c . || true) files back to HEAD $(git rev-parse --short HEAD)," \
  "$(wc -l < device-untracked.txt) untracked to drop"
