#!/bin/bash
# The GPU tier on a lent GPU machine: no network, no Docker, its own Python and CUDA torch.
# Carries .gpu/ (made here by `python -m tests.support.gpu_carry`); the log goes to $OUT.
set -o pipefail
cd "$(dirname "$0")/../.."
# Into the machine's own environment: the stub's embedded interpreter ignores PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    .gpu/whl/*.whl || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 TRITON_BUILDER_CACHE=/tmp/tb-cache
TRITON_BUILDER_PYTRITON_WHEEL=$(ls "$PWD"/.gpu/nvidia_pytriton-*_x86_64.whl) || exit 3
export TRITON_BUILDER_PYTRITON_WHEEL
mkdir -p "$TRITON_BUILDER_CACHE/perf-analyzer"
tar -xJf .gpu/perf-analyzer.tar.xz -C "$TRITON_BUILDER_CACHE/perf-analyzer" || exit 3
nvidia-smi -L
python3 -c "import sys, numpy, torch; print(sys.version.split()[0], 'numpy', numpy.__version__,
    'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
python3 -m pytest tests/gpu tests/e2e/test_gpu_tier_on_cpu.py -v -rs -p no:cacheprovider \
    --timeout 200 2>&1 | tee "${OUT:-.}/gpu-tier.log"
