#!/usr/bin/env bash
# Everything a lent GPU machine should run, in one go, each part bounded in time:
#   1. make gpu-check (scripts/gpu_check.py): FSDP train, sharded checkpoint, resume, consolidate
#   2. the GPU training bench (python -m benchmarks --gpu), one preset at a time (a timeout keeps
#      what finished): the three sides' tokens/s, ratios and steady-state MFU
# Usage: scripts/gpu_all.sh OUT_DIR [PYTHON]. Logs and JSON land in OUT_DIR; the last lines
# printed are the tables. Exit status: the number of parts that failed.
# Environment: GPU_DEADLINE (seconds for everything, default 1200: each part is cut to what is
# left, so the summary is always printed), GPU_BENCH_ARGS (e.g. "--rounds 1"), GPU_PARTS (a
# subset of "gpu_check gpt2_124m llama_124m", the default and the order).
set -u
out=${1:?usage: scripts/gpu_all.sh OUT_DIR [PYTHON]}
py=${2:-python3}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
failed=0
deadline=$((SECONDS + ${GPU_DEADLINE:-1200} - 10))
part() {  # part NAME SECONDS CMD...: run, log to OUT_DIR/NAME.log, count a failure
  local name=$1 limit=$2
  shift 2
  [ "$limit" -le $((deadline - SECONDS)) ] || limit=$((deadline - SECONDS))
  [ "$limit" -gt 5 ] || { echo "== $name: skipped, no time left"; failed=$((failed + 1)); return; }
  echo "== $name (at most ${limit}s): $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s"
  [ "$rc" -eq 0 ] || { failed=$((failed + 1)); tail -25 "$out/$name.log"; }
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
# what every part needs, in seconds rather than after the first part's time-out
"$py" -c "import torch, pytorch_lightning, hydra, mlflow, tiktoken, scalelab.cli.train; \
tiktoken.get_encoding('r50k_base'); print('torch', torch.__version__, 'lightning', \
pytorch_lightning.__version__, 'mlflow', mlflow.__version__, torch.cuda.get_device_name(0))" || exit 99
for name in ${GPU_PARTS:-gpu_check gpt2_124m llama_124m}; do
  case $name in
    gpu_check) part gpu_check 150 "$py" scripts/gpu_check.py --workdir /tmp/gpu_check ;;
    # shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of arguments
    *) part "bench_$name" 420 "$py" -m benchmarks --gpu --presets "$name" \
         --json "$out/bench_$name.json" ${GPU_BENCH_ARGS:-} ;;
  esac
done
echo "== summary"
grep -h -E "^\[(PASS|FAIL)\]|ALL PASS|^FAILED" "$out/gpu_check.log" 2>/dev/null
for preset in gpt2_124m llama_124m; do
  grep -h -A2 -E "^preset " "$out/bench_$preset.log" 2>/dev/null
  grep -h -E "MFU|BELOW TARGET|round " "$out/bench_$preset.log" 2>/dev/null
done
exit "$failed"
