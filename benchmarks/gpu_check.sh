#!/usr/bin/env bash
# GPU check for a lent GPU box (about 2-4 minutes; hard limit 5): bf16 full and LoRA GRPO updates with the
# hf backend, generation tokens/s and peak memory; unsloth and vllm where installed. Uses $PYTHON, else
# .venv/bin/python, else python3: that interpreter needs a CUDA build of torch and labmod installed
# (pip install -e . on the box; see README "GPU boxes").
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 300 "$PYTHON" benchmarks/gpu_check.py "$@"
