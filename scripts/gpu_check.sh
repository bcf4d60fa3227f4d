#!/usr/bin/env bash
# The GPU checks, as one prepared script for a machine with one CUDA GPU and no internet
# (about 10 minutes): the `gpu`-marked tests, then a 2-step debug run with the vLLM engine on CUDA.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        # results in OUT_DIR (default: gpu_check_out/)
#
# Needs a Python with rlfw's dependencies and the CUDA `vllm` (the cluster image,
# deploy/docker/Dockerfile, or `pip install -e ".[vllm,dev]"`). Wheels in .whl/ (see the README,
# "GPU checks") are installed first, offline, when present. Each part's log is kept; the summary
# says what passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/rlfw-site .whl/*.whl \
    && export PYTHONPATH="/tmp/rlfw-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
"$PY" - <<'PYEOF' 2>&1 | tee -a "$summary"
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
for m in ("transformers", "peft", "hydra", "ray", "gymnasium", "vllm"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as exc:
        print(m, "MISSING", type(exc).__name__)
PYEOF

run() {  # run NAME TIMEOUT_S CMD...: log to $OUT/NAME.log, one summary line
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: $([ $rc -eq 0 ] && echo PASSED || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s"
}

has() { "$PY" -c "import $1" > /dev/null 2>&1; }
run gpu_tests 480 "$PY" -m pytest -q -rs -s -p no:cacheprovider -m gpu tests/rlfw/test_gpu.py
grep -E "passed|failed|skipped|SKIPPED|error" "$OUT/gpu_tests.log" | tail -4 | tee -a "$summary"
if ! has vllm || ! has ray; then
  note "vllm_cuda_debug_run: SKIPPED (needs the CUDA vllm and ray in this Python)"
else
  run vllm_cuda_debug_run 360 "$PY" -m rlfw.run experiment=debug model=tiny_vl_sft cluster=single_gpu \
    cluster.vllm.memory_utilization=0.3 cluster.vllm.max_lora_rank=16 model.lora.rank=16 env.eval_size=16 \
    logger=console trainer.output_dir="$OUT/vllm_run"
fi
if [ -f "$OUT/vllm_run/metrics.jsonl" ]; then
  "$PY" - "$OUT/vllm_run/metrics.jsonl" <<'PYEOF' 2>&1 | tee -a "$summary"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if "policy/loss" in r:
        print(f"step {r['step']}: engine_weights_version={r['policy/engine_weights_version']:.0f} "
              f"rollout_logp_abs_diff={r['policy/rollout_logp_abs_diff']:.2e} timing/step={r['timing/step']:.2f}s")
PYEOF
fi
cat "$summary"
