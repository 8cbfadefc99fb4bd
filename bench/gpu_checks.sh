#!/usr/bin/env bash
# The GPU checks in one script, for a machine with an NVIDIA GPU: installs the nvidia flavour in its
# own venv and runs every test that needs CUDA (TensorRT engine serving, torch backends on CUDA, CUDA
# shared memory through cuda-python).
# Usage: bash bench/gpu_checks.sh   (output also in $OUT/gpu_checks.log when OUT is set)
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi || { echo "no NVIDIA GPU visible"; exit 1; }
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install --quiet torch
.venv-gpu/bin/pip install --quiet -e '.[nvidia,test]'
log=${OUT:-.}/gpu_checks.log
.venv-gpu/bin/python -m pytest -v -rs tests/appliance/backends/test_tensorrt.py \
  tests/appliance/protocol/shared_memory/test_cuda.py tests/appliance/rest/test_cuda_shared_memory_e2e.py 2>&1 | tee "$log"
