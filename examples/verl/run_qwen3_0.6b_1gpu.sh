#!/usr/bin/env bash
# AEPO on verl, one GPU, Qwen3-0.6B, the built-in synthetic task (docs/verl.md).
# Extra arguments are verl overrides appended to the command (e.g. trainer.total_training_steps=2).
# UNVERIFIED on a GPU: the overrides are composed and validated against verl 0.9.1 by
# tests/test_verl_config_on_cpu.py, but no main_ppo run of this script has been made.
set -euo pipefail
DATA=${DATA:-$HOME/data/aepo_synthetic}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
[ -f "$DATA/train.parquet" ] || aepo verl-data --task synthetic --out "$DATA"
REWARD=$(python -c 'import aepo_rl.integrations.verl.reward as r; print(r.__file__)')

python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    critic.enable=false \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/val.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=1024 \
    data.max_response_length=4096 \
    reward.custom_reward_function.path="$REWARD" \
    reward.custom_reward_function.name=compute_score \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 \
    actor_rollout_ref.actor.use_dynamic_bsz=true \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384 \
    actor_rollout_ref.actor.policy_loss.loss_mode=aepo \
    actor_rollout_ref.actor.policy_loss._target_=aepo_rl.integrations.verl.loss.AEPOPolicyLossConfig \
    +actor_rollout_ref.actor.policy_loss.entropy_adv_coef=0.2 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.2 \
    actor_rollout_ref.actor.clip_ratio_c=3.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.calculate_entropy=true \
    actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking=true \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.use_kl_loss=false \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.agent.default_agent_loop=aepo_tree \
    +actor_rollout_ref.rollout.custom.aepo.global_samples=4 \
    +actor_rollout_ref.rollout.custom.aepo.entropy_weight=0.2 \
    +actor_rollout_ref.rollout.custom.aepo.entropy_measure=surprisal \
    +actor_rollout_ref.rollout.custom.aepo.call_limit=6 \
    +actor_rollout_ref.rollout.custom.aepo.max_tokens_per_round=1024 \
    +actor_rollout_ref.rollout.custom.aepo.max_tool_response_tokens=512 \
    +actor_rollout_ref.rollout.custom.aepo.tools=[search,python] \
    +actor_rollout_ref.rollout.custom.aepo.task.name=synthetic \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=1 \
    trainer.total_epochs=5 \
    trainer.test_freq=10 \
    trainer.save_freq=-1 \
    trainer.project_name=aepo_verl \
    trainer.experiment_name=qwen3_0.6b_1gpu \
    trainer.logger=[console,tensorboard] \
    "$@"
