#!/usr/bin/env bash
# End-to-end ComfyUI benchmark on one GPU (benchmarks/e2e_comfyui.py): the device image has
# torch 2.11 + Triton 3.6 on python 3.12 but not ComfyUI or some of its pure-Python needs, so
# they travel as wheels (benchmarks/e2e_wheels.txt, about 44 MB).
#
# 1. Once, on the development machine, in the repository root (.whl/ is git-ignored):
#
#      python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#        --platform manylinux1_x86_64 -d .whl -r benchmarks/e2e_wheels.txt
#
# 2. On the device (tool `run`, carry [".whl"], timeout_s 600), from the repository root:
#
#      bash benchmarks/e2e_run.sh --models wan        # Wan2.1-14B
#      bash benchmarks/e2e_run.sh --models hunyuan --reps 1 --methods dense,kernels,stub,sol85,sol90,psa60
#      bash benchmarks/e2e_run.sh --models ltxv       # LTX-Video 0.9 2B, small
#      bash benchmarks/e2e_run.sh --models hunyuan15 --reps 1 --methods dense,stub,sol85,sol90,psa60
#                                                     # HunyuanVideo 1.5 8.3B, 720p 121 frames
#      bash benchmarks/e2e_run.sh --models wan22_5b --methods dense,stub,sol85,sol90,psa60
#                                                     # Wan 2.2 TI2V 5B, 1280x704 121 frames
#
#    (the first three ran on an H200, the last two on an H100: BENCHMARKS.md; psa60 uses the
#    model's shipped preset, for the last two hunyuan_video1.5_720p_121f and
#    wan2.2_ti2v_5b_720p_121f, which fit these grids)
#
#    The node methods once per precision of the exact blocks, with the output drift of int8
#    against bf16 beside each method's own drift against dense (ran on an H100:
#    e2e_comfyui_h100_wan_precisions.json; on sm_90 auto picks bf16 for Sol and int8 for PSA,
#    so the sol85@bf16 and psa60@int8 rows run what auto runs there, the table's "ran" column):
#
#      bash benchmarks/e2e_run.sh --models wan --methods dense,sol85,psa60 --precisions bf16,int8 --reps 1
#
#    Any other e2e_comfyui.py flag passes through (--methods, --reps, --dense-blocks, ...).
#    Results go to $OUT (else out/, git-ignored): e2e_comfyui_<gpu>_<models>.json and .log,
#    <gpu> being h200 or h100 from the name nvidia-smi gives the first GPU, else "other" (the
#    JSON's device field has the full name); the JSON is rewritten after every measurement, so
#    a run cut at its time limit keeps what it measured. A JSON that backs a figure of
#    BENCHMARKS.md goes to benchmarks/results/.
set -uo pipefail
cd "$(dirname "$0")/.."

site=${E2E_SITE:-/tmp/site}
wheels=()
while IFS= read -r line || [ -n "$line" ]; do
  spec=${line%%#*}
  spec=${spec//[[:space:]]/}
  [ -z "$spec" ] && continue
  name=${spec%%==*}
  version=${spec##*==}
  file=$(ls .whl/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -n 1)
  if [ -z "$file" ]; then
    echo "e2e_run.sh: no wheel for $spec in .whl/ (download step in the header of $0; carry .whl)" >&2
    exit 2
  fi
  wheels+=("$file")
done < benchmarks/e2e_wheels.txt

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "${wheels[@]}" || exit 3
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

tag=wan
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --models) tag=${args[$((i + 1))]:-wan} ;;
    --models=*) tag=${args[$i]#--models=} ;;
  esac
done
tag=${tag//,/-}
dest=${OUT:-out}
mkdir -p "$dest"

# The GPU in the file names: h200 or h100 when the first GPU's name says so as a word
# ("NVIDIA H200", "NVIDIA H100 80GB HBM3"), else other.
gpu_tag() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  if [[ $name =~ (^|[^[:alnum:]])H200([^[:alnum:]]|$) ]]; then
    echo h200
  elif [[ $name =~ (^|[^[:alnum:]])H100([^[:alnum:]]|$) ]]; then
    echo h100
  else
    echo other
  fi
}
gpu=$(gpu_tag)

nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader || true
export E2E_LAUNCHER="bash benchmarks/e2e_run.sh $*"
python3 benchmarks/e2e_comfyui.py --out "$dest/e2e_comfyui_${gpu}_$tag.json" "$@" 2>&1 \
  | tee "$dest/e2e_comfyui_${gpu}_$tag.log"
exit "${PIPESTATUS[0]}"
