#!/usr/bin/env bash
# Create .venv and install rlfw with its test extras, CPU-only torch pinned (no CUDA download).
# Usage: bash scripts/setup.sh            (idempotent; re-running only checks the install)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import rlfw, envs, torch, transformers, peft, ray, hydra, gymnasium, pytest, hypothesis" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  # constraints-cpu.txt pins torch to the CPU build; drop it on a GPU machine (see README).
  .venv/bin/python -m pip install -q -c constraints-cpu.txt -e ".[dev]"
fi
echo "rlfw: environment ready in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
