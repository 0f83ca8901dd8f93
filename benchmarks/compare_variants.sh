#!/usr/bin/env bash
# Runs one command once per kernel variant, in one device call, so the variants are timed in
# the same run (and against the same cuDNN). A variant is a folder of replacement files for
# kernels/ (say variants/pair/hopper_loop.py); before each run its files are copied over
# kernels/, and afterwards the originals come back. The command sees $VARIANT (the folder's
# name) and writes under $OUT/$VARIANT/ (created).
#   bash benchmarks/compare_variants.sh 'python3 benchmarks/bench_kernels.py ... --out $OUT/$VARIANT/k.json' \
#       variants/main variants/pair
# Exits non-zero if any run did (every variant still runs).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    echo "usage: bash benchmarks/compare_variants.sh COMMAND VARIANT_DIR [VARIANT_DIR ...]" >&2
    exit 2
fi
command=$1
shift
for dir in "$@"; do
    if ! ls "$dir"/*.py >/dev/null 2>&1; then
        echo "compare_variants: $dir holds no .py file for kernels/" >&2
        exit 2
    fi
    for f in "$dir"/*.py; do
        if [ ! -f "kernels/$(basename "$f")" ]; then
            echo "compare_variants: $f replaces nothing: kernels/$(basename "$f") does not exist" >&2
            exit 2
        fi
    done
done
backup=$(mktemp -d)
cp kernels/*.py "$backup"/
restore() { cp "$backup"/*.py kernels/; rm -rf "$backup"; }
trap restore EXIT
status=0
for dir in "$@"; do
    export VARIANT
    VARIANT=$(basename "$dir")
    cp "$backup"/*.py kernels/
    cp "$dir"/*.py kernels/
    mkdir -p "${OUT:-.}/$VARIANT"
    echo "== variant $VARIANT ($(cd "$dir" && ls *.py | tr '\n' ' '))"
    start=$(date +%s)
    bash -c "$command" || { echo "== variant $VARIANT: exit $?" >&2; status=1; }
    echo "== variant $VARIANT: $(( $(date +%s) - start )) s"
done
exit $status
