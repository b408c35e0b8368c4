#!/usr/bin/env bash
# AEPO on verl, one node of 8 GPUs, Qwen3-8B, with the release's hyper-parameters (docs/verl.md):
# n = 12 rollouts per prompt of which 6 global samples, 64 prompts per step, mini-batch 8 prompts,
# learning rate 1e-6, clip 0.2/0.2 with dual clip 3, 6 tool calls, response budget 6192 tokens.
# DATA must hold train.parquet / val.parquet from `aepo verl-data` (your files: --task file
# task.train_files=[...] task.val_files=[...]) and TASK_OVERRIDES the +...custom.aepo.task.* lines it
# printed. Extra arguments are verl overrides appended to the command.
# UNVERIFIED on GPUs: the overrides are composed and validated against verl 0.9.1 by
# tests/test_verl_config_on_cpu.py, but no main_ppo run of this script has been made.
set -euo pipefail
DATA=${DATA:-$HOME/data/aepo_synthetic}
MODEL=${MODEL:-Qwen/Qwen3-8B}
[ -f "$DATA/train.parquet" ] || aepo verl-data --task synthetic --out "$DATA"
REWARD=$(python -c 'import aepo_rl.integrations.verl.reward as r; print(r.__file__)')
read -r -a TASK_OVERRIDES <<< "${TASK_OVERRIDES:-+actor_rollout_ref.rollout.custom.aepo.task.name=synthetic}"

python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=false \
    critic.enable=false \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/val.parquet" \
    data.train_batch_size=64 \
    data.max_prompt_length=2000 \
    data.max_response_length=6192 \
    reward.custom_reward_function.path="$REWARD" \
    reward.custom_reward_function.name=compute_score \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_epochs=1 \
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
    actor_rollout_ref.rollout.n=12 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.agent.default_agent_loop=aepo_tree \
    +actor_rollout_ref.rollout.custom.aepo.global_samples=6 \
    +actor_rollout_ref.rollout.custom.aepo.entropy_weight=0.2 \
    +actor_rollout_ref.rollout.custom.aepo.entropy_measure=surprisal \
    +actor_rollout_ref.rollout.custom.aepo.branch_threshold=0.5 \
    +actor_rollout_ref.rollout.custom.aepo.branch_penalty=0.05 \
    +actor_rollout_ref.rollout.custom.aepo.call_limit=6 \
    +actor_rollout_ref.rollout.custom.aepo.max_tokens_per_round=2048 \
    +actor_rollout_ref.rollout.custom.aepo.max_tool_response_tokens=1024 \
    +actor_rollout_ref.rollout.custom.aepo.tools=[search,python] \
    "${TASK_OVERRIDES[@]}" \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=8 \
    trainer.total_epochs=5 \
    trainer.test_freq=10 \
    trainer.save_freq=20 \
    trainer.project_name=aepo_verl \
    trainer.experiment_name=qwen3_8b_8gpu \
    trainer.logger=[console,tensorboard] \
    "$@"
