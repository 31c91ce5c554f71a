#!/usr/bin/env bash
# The main job, end to end on this machine: installs what is missing, builds crescent, makes
# the default `small` model (deterministic random weights with the real Qwen vocabulary) if it
# is absent, then generates text from it and benchmarks the engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== build (release)"
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
bin=build/release/apps/crescent
model=models/small
if [ ! -f "$model/config.json" ]; then
  echo "== make the default model: $bin make-model --preset small --out $model"
  "$bin" make-model --preset small --out "$model"
fi
echo
echo "== generate (greedy) from $model"
"$bin" generate --model "$model" --prompt "The capital of France is" --max-tokens 32 --temperature 0
echo
echo "== generate (chat template, sampled, seed 7)"
"$bin" generate --model "$model" --chat --prompt "Write a haiku about the moon." --max-tokens 32 \
  --temperature 0.8 --top-p 0.95 --seed 7
echo
echo "== engine benchmark on $model (2 threads)"
"$bin" bench engine --model "$model" --threads 2 --prompt-len 512 --reps 2
echo
echo "The weights are random, so the text is not meant to read well: what runs is the real"
echo "tokenizer, chat template, paged KV cache, scheduler and kernels. Logs above; model in $model."
