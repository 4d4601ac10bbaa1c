#!/usr/bin/env bash
# The GSM8K-style GDPO recipe on CPU: a smoke run of the whole path, not a learning run.
#
#   bash examples/gdpo/gsm8k/run_cpu.sh [extra relax train flags]
#
# 1. explain_rewards.py: scripted completions of every bundled problem -> reward.py -> GRPO's and
#    GDPO's real reward/advantage stages -> the diagnostics (no model; shows what GDPO computes here).
# 2. relax train with the GPU recipe's flags (data, chat template, prompt suffix, three reward keys,
#    GDPO) for 3 steps, on a tiny *random* Qwen3-style checkpoint built locally
#    (tests/hf/tiny_checkpoints.py, ~300k parameters, a 50-word tokenizer). The built-in 17-token
#    model cannot encode the questions at all (it knows digits, + = and two tags), so the recipe
#    cannot run on it; and no model this small can learn GSM8K. The 50 words have no '<' or '>', so
#    the tags cannot be written and reward.py alone would score every completion 0 (a run in which no
#    step trains is an error): the reward is tiny_reward.py, which reads the word 'answer' as the tags
#    and then scores with reward.py unchanged. The run shows that loading, templating, generation,
#    scoring, GDPO and the diagnostics work, and that the steps train.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
HERE="${REPO_ROOT}/examples/gdpo/gsm8k"
cd "${REPO_ROOT}"
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

echo "== 1/2: what GRPO and GDPO do with this recipe's rewards (scripted completions) =="
python -m examples.gdpo.gsm8k.explain_rewards

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
echo
echo "== 2/2: relax train, recipe flags, tiny random Qwen3-style checkpoint, 3 steps =="
python -c "import sys; sys.path.insert(0, 'tests/hf'); from tiny_checkpoints import build_checkpoint; build_checkpoint('${WORK}/tiny-qwen3', 'qwen3')"
PROMPT_SUFFIX="$(python -c 'from examples.gdpo.gsm8k.reward import PROMPT_SUFFIX; print(PROMPT_SUFFIX)')"

relax train \
  --advantage-estimator gdpo \
  --hf-checkpoint "${WORK}/tiny-qwen3" \
  --prompt-data "${HERE}/data/gsm8k_mini.jsonl" --input-key question --label-key answer \
  --apply-chat-template --prompt-suffix "${PROMPT_SUFFIX}" \
  --custom-rm-path examples.gdpo.gsm8k.tiny_reward:reward \
  --reward-keys correctness format integer --reward-weights 1.0 1.0 1.0 --reward-key correctness \
  --num-rollout 3 --rollout-batch-size 4 --n-samples-per-prompt 4 --global-batch-size 8 \
  --rollout-max-response-len 24 --rollout-temperature 1.0 \
  --lr 1e-4 --eps-clip 0.2 --eps-clip-high 0.28 --kl-coef 0.0 \
  --actor-num-workers 1 --backend torch --no-progress \
  --output-dir "${OUTPUT_DIR:-${WORK}/out}" \
  "$@"
