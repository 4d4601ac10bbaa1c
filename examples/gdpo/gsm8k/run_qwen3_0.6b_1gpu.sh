#!/usr/bin/env bash
# GDPO on GSM8K-style problems with a Qwen3-0.6B-class model on one GPU.
#
#   MODEL_DIR=/models/Qwen3-0.6B bash examples/gdpo/gsm8k/run_qwen3_0.6b_1gpu.sh [extra relax train flags]
#
# MODEL_DIR: a local Hugging Face checkpoint directory (config, weights, tokenizer); nothing is
#            downloaded. DATA: a JSONL file with "question" and "answer" fields (raw GSM8K answers
#            ending in "#### N" work as labels); default: the bundled 52-problem file, which is a smoke
#            set, not a training set; point DATA at a real GSM8K-style train split for a real run.
# Extra arguments are passed to `relax train` (e.g. --num-rollout 5, or --dry-run to only validate).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
HERE="${REPO_ROOT}/examples/gdpo/gsm8k"
: "${MODEL_DIR:?set MODEL_DIR to a local Qwen3-0.6B-class Hugging Face checkpoint directory}"
DATA="${DATA:-${HERE}/data/gsm8k_mini.jsonl}"
OUTPUT_DIR="${OUTPUT_DIR:-outputs/gdpo-gsm8k-qwen3-0.6b}"

cd "${REPO_ROOT}"
# The reward function is imported as examples.gdpo.gsm8k.reward: the repository root must be importable.
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
# One source of truth for the prompt suffix: the reward module that checks the format it asks for.
PROMPT_SUFFIX="$(python -c 'from examples.gdpo.gsm8k.reward import PROMPT_SUFFIX; print(PROMPT_SUFFIX)')"

relax train \
  --advantage-estimator gdpo \
  --hf-checkpoint "${MODEL_DIR}" \
  --prompt-data "${DATA}" --input-key question --label-key answer \
  --apply-chat-template --prompt-suffix "${PROMPT_SUFFIX}" \
  --custom-rm-path examples.gdpo.gsm8k.reward:reward \
  --reward-keys correctness format integer --reward-weights 1.0 1.0 1.0 --reward-key correctness \
  --num-rollout 200 --rollout-batch-size 16 --n-samples-per-prompt 8 --global-batch-size 64 \
  --rollout-max-response-len 1024 --rollout-temperature 1.0 \
  --lr 1e-6 --clip-grad 1.0 --eps-clip 0.2 --eps-clip-high 0.28 --kl-coef 0.0 --entropy-coef 0.0 \
  --actor-num-workers 1 --backend torch \
  --save-interval 50 --output-dir "${OUTPUT_DIR}" \
  "$@"
