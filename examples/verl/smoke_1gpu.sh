#!/usr/bin/env bash
# Two AEPO steps of verl's main_ppo on one GPU with Qwen3-0.6B and a small synthetic task: the check
# that the plugin works end to end (docs/verl.md, "What was verified"). Needs a GPU, vLLM and the Hub.
# It passes when both steps finish and the log shows actor/pg_loss, actor/entropy_adv_scale/mean and
# actor/grad_preserved_frac for each step. UNVERIFIED until someone runs it on a GPU.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export DATA=${DATA:-$(mktemp -d)/aepo_smoke}
aepo verl-data --task synthetic --out "$DATA" task.num_train=32 task.num_dev=8 task.num_test=8
bash "$HERE/run_qwen3_0.6b_1gpu.sh" \
    +actor_rollout_ref.rollout.custom.aepo.task.num_train=32 \
    +actor_rollout_ref.rollout.custom.aepo.task.num_dev=8 \
    +actor_rollout_ref.rollout.custom.aepo.task.num_test=8 \
    data.max_response_length=1024 \
    trainer.total_training_steps=2 \
    trainer.val_before_train=false \
    trainer.test_freq=-1 \
    trainer.logger=[console] \
    "$@" 2>&1 | tee "$DATA/smoke.log"
for metric in actor/pg_loss actor/entropy_adv_scale/mean actor/grad_preserved_frac; do
    grep -q "$metric" "$DATA/smoke.log" || { echo "smoke: metric $metric missing from $DATA/smoke.log"; exit 1; }
done
echo "smoke: 2 AEPO steps finished; log in $DATA/smoke.log"
