#!/usr/bin/env bash
# The GPU check of docs/gpu.md, for one machine with a CUDA GPU whose python3 has torch and transformers
# (about 8 minutes on one H200). The project's other dependencies come along as wheels in .whl/
# (lab/gpu/gpu_wheels.sh builds that folder on a machine with network). Run from anywhere:
#
#     OUT=/some/folder bash lab/gpu/gpu_check.sh
#
# Writes into $OUT: gpu.txt (the machine), gpu_tests.log (pytest -m gpu), train.log and metrics.jsonl
# (2 RL steps of a random Qwen3-0.6B shape: step seconds, rollout tokens, peak memory), probe.log and
# probe.json (one training step of the 0.6B and 8B shapes at 8192 tokens: full weights and LoRA).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/aepo-gpu-check}"
mkdir -p "$OUT"
source lab/gpu/gpu_env.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
  git log -1 --format='commit %h %s' 2>/dev/null; } 2>&1 | tee "$OUT/gpu.txt"

echo "== 1/3 the gpu tests"
timeout 170 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log"

echo "== 2/3 two RL steps of a random Qwen3-0.6B shape on the GPU"
rm -rf /tmp/aepo-gpu-runs
timeout 240 python3 -m aepo_rl train model.init=random:qwen3-0.6b model.dtype=bfloat16 \
    model.gradient_checkpointing=true trainer.device=cuda sft.epochs=0 trainer.steps=2 eval.num_questions=16 \
    trainer.run_dir=/tmp/aepo-gpu-runs trainer.run_name=qwen3-0.6b 2>&1 | tee "$OUT/train.log"
cp /tmp/aepo-gpu-runs/qwen3-0.6b/metrics.jsonl "$OUT/" 2>/dev/null

echo "== 3/3 memory probe: one training step at 8192 tokens"
timeout 170 python3 lab/gpu/gpu_probe.py --out "$OUT/probe.json" 2>&1 | tee "$OUT/probe.log"
