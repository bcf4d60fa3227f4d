#!/usr/bin/env bash
# Create .venv and install rlfw with its test extras, CPU-only torch pinned (no CUDA download).
# Usage: bash scripts/setup.sh            (idempotent; re-running only checks the install)
#        bash scripts/setup.sh --vllm     also the vLLM environment .venv-vllm (scripts/setup_vllm_cpu.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Idempotent: quick when everything is already installed. constraints-cpu.txt locks every package at
# the version CI tests, torch on its CPU build; drop it on a GPU machine (see README).
echo "rlfw: installing into .venv (log: .venv/pip-install.log)"
if ! .venv/bin/python -m pip install --disable-pip-version-check -c constraints-cpu.txt -e ".[dev]" \
    > .venv/pip-install.log 2>&1; then
  tail -n 40 .venv/pip-install.log
  exit 1
fi
.venv/bin/python -c "import rlfw, envs, torch, transformers, peft, ray, hydra, gymnasium, pytest, hypothesis, s3fs, moto"
echo "rlfw: environment ready in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
if [ "${1:-}" = "--vllm" ]; then
  bash scripts/setup_vllm_cpu.sh
fi
