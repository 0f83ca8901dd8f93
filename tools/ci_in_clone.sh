#!/usr/bin/env bash
# Runs .ci/run as CI does: in a fresh clone of HEAD, with ../shared beside it, then removes
# the clone. One run leaves ~8.8 GB behind (two venvs, Triton 3.6, caches); clones kept in
# /tmp once filled the disk that a later CI run needed ("No space left on device" in pip).
#   bash tools/ci_in_clone.sh [LOG]   LOG: where the run's output goes (default: stdout)
# Exits with .ci/run's status.
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
shared=$(realpath "$repo/../shared")
work=$(mktemp -d "${TMPDIR:-/tmp}/svattn-ci.XXXXXX")
trap 'rm -rf "$work"' EXIT
git clone --quiet "$repo" "$work/clone"
ln -s "$shared" "$work/shared"
echo "== ci_in_clone: $(git -C "$work/clone" log --oneline -1) in $work"
cd "$work/clone"
if [ $# -ge 1 ]; then
    CI=true bash .ci/run >"$1" 2>&1
else
    CI=true bash .ci/run
fi
