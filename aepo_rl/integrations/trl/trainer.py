"""``AEPOGRPOTrainer``: TRL's GRPOTrainer with aepo_rl's entropy-balanced policy loss (docs/trl.md).

Everything but the policy loss is TRL's: data, generation (or :class:`TreeRolloutFunc`), rewards,
group advantages, old/reference log-probs, the optimizer loop. ``_compute_loss`` runs TRL's own
forward (log-probs and entropies of the completion tokens, one pass), then aepo_rl's registered
``aepo`` loss on those tensors:

- entropy-aware advantage Ã_t = A·(1 + a·z_t), z from this forward's detached entropies over the
  micro-batch's loss tokens (docs/algorithm.md §2.2, scope ``micro-batch`` as the release);
- clipped surrogate with the stop-gradient upper bound (1+ε_h)·r/sg(r) (§2.3); TRL's ``delta``
  (two-sided clipping) is the dual clip c of §2.3;

and the per-token loss is reduced by ``aggregate``, TRL's normalisation for its ``loss_type``
(§2.5 lists aepo_rl's own modes; these are the host's). With ``aepo_sg_upper_clip=False`` and
``aepo_entropy_adv_coef=0`` the loss is TRL's clipped surrogate, value and gradient
(tests/test_trl.py checks both against the stock GRPOTrainer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import GRPOConfig, GRPOTrainer

from aepo_rl.algorithms import get_policy_loss, kl_penalty
from aepo_rl.config import AlgorithmConfig

SUPPORTED_LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo")
"""TRL loss types whose per-token loss is the PPO clipped surrogate; AEPO modifies exactly that."""

_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                 "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
"""Batch keys TRL's forward takes besides the token ids (multimodal models), passed through unchanged."""


@dataclass
class AEPOGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus AEPO's loss knobs (docs/algorithm.md §2.2, §2.3).

    TRL's own keys keep their meaning: ``epsilon`` / ``epsilon_high`` are ε_l / ε_h, ``delta`` is the
    dual-clip bound c for A < 0 (None: no dual clip), ``beta`` the KL coefficient, ``loss_type`` the
    aggregation. Both AEPO knobs off (``aepo_sg_upper_clip=False``, ``aepo_entropy_adv_coef=0``)
    gives TRL's GRPO loss.
    """

    aepo_sg_upper_clip: bool = field(default=True, metadata={
        "help": "Stop-gradient upper clip (docs/algorithm.md §2.3): tokens above 1+epsilon_high with A > 0 keep the "
                "gradient (1+ε_h)·∇log π instead of 0. False: PPO's hard clip."})
    aepo_entropy_adv_coef: float = field(default=0.2, metadata={
        "help": "a in the entropy-aware advantage Ã = A·(1 + a·z), z the token entropy standardised over the "
                "micro-batch's loss tokens (docs/algorithm.md §2.2); 0 turns it off."})
    aepo_entropy_adv_clamp: bool = field(default=False, metadata={
        "help": "Clamp the advantage scale 1 + a·z at 0 (docs/algorithm.md §2.2)."})
    aepo_grad_preserve_entropy_quantile: float | None = field(default=None, metadata={
        "help": "Keep the upper-clip gradient only for tokens whose entropy is at or above this quantile of the "
                "micro-batch's loss tokens (the paper's reading of §2.3); None: every token (the release)."})

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(f"AEPOGRPOConfig: loss_type={self.loss_type!r} is not supported; AEPO changes the clipped "
                             f"surrogate of loss_type in {SUPPORTED_LOSS_TYPES} (set one of them)")
        unsupported = {
            "importance_sampling_level": (self.importance_sampling_level != "token", "'token'"),
            "top_entropy_quantile": (self.top_entropy_quantile != 1.0,
                                     "1.0 (AEPO's entropy option is aepo_grad_preserve_entropy_quantile)"),
            "off_policy_mask_threshold": (self.off_policy_mask_threshold is not None, "None"),
            "entropy_coef": (self.entropy_coef != 0.0, "0.0"),
            "use_adaptive_entropy": (self.use_adaptive_entropy, "False"),
        }
        for key, (bad, fix) in unsupported.items():
            if bad:
                raise ValueError(f"AEPOGRPOConfig: {key}={getattr(self, key)!r} is not supported with the AEPO loss; "
                                 f"set {key}={fix}")
        if self.aepo_entropy_adv_coef < 0:
            raise ValueError(f"AEPOGRPOConfig: aepo_entropy_adv_coef={self.aepo_entropy_adv_coef} must be >= 0 "
                             "(0 turns the entropy-aware advantage off)")
        quantile = self.aepo_grad_preserve_entropy_quantile
        if quantile is not None and not 0 <= quantile <= 1:
            raise ValueError(f"AEPOGRPOConfig: aepo_grad_preserve_entropy_quantile={quantile} "
                             "must be in [0, 1] or None")
        eps_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if self.delta is not None and self.delta <= 1 + eps_high:
            raise ValueError(f"AEPOGRPOConfig: delta={self.delta} must be > 1 + epsilon_high = {1 + eps_high} (it is "
                             "the dual-clip bound c of docs/algorithm.md §2.3), or None for no dual clip")


class AEPOGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose policy loss is aepo_rl's ``aepo`` loss (§2.2 + §2.3); same arguments.

    ``args`` must be an :class:`AEPOGRPOConfig`. Use ``rollout_func=TreeRolloutFunc(tools)`` for
    AEPO's tree rollouts (§1), or TRL's own generation for independent samples.
    """

    _tag_names = ["trl", "grpo", "aepo"]
    _name = "AEPO"

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, AEPOGRPOConfig):
            raise TypeError(f"AEPOGRPOTrainer needs args=AEPOGRPOConfig(...) (it holds the AEPO loss knobs); got "
                            f"{type(config).__name__}")
        super().__init__(*args, **kwargs)
        if self.aux_loss_enabled:
            raise ValueError("AEPOGRPOTrainer: the MoE router auxiliary loss is not supported; set "
                             "router_aux_loss_coef=0.0 in AEPOGRPOConfig")
        self.aepo_loss_config = AlgorithmConfig(
            policy_loss="aepo", clip_ratio_low=self.epsilon_low, clip_ratio_high=self.epsilon_high,
            clip_ratio_c=config.delta, entropy_adv_coef=config.aepo_entropy_adv_coef,
            entropy_adv_scope="micro-batch", entropy_adv_clamp=config.aepo_entropy_adv_clamp,
            sg_upper_clip=config.aepo_sg_upper_clip,
            grad_preserve_entropy_quantile=config.aepo_grad_preserve_entropy_quantile)
        self._aepo_loss = get_policy_loss("aepo")

    def _aggregate(self, inputs, mode: str):
        """TRL's reduction for ``loss_type`` (the host's aggregation, docs/algorithm.md §2.5), as
        ``aggregate(loss_mat, mask)`` for the aepo loss; the per-token loss already holds the vLLM
        importance weight and the KL term."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1

        def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            weight = mask.to(loss_mat.dtype)
            total = (loss_mat * weight).sum()
            if self.loss_type == "bnpo":
                return total / weight.sum().clamp(min=1.0) / accumulation
            if self.loss_type == "grpo":
                per_row = (loss_mat * weight).sum(-1) / weight.sum(-1).clamp(min=1.0)
                return per_row.mean() / accumulation
            if self.loss_type == "dr_grpo":
                return total / (loss_mat.shape[0] * self.max_completion_length) / accumulation
            # dapo: tokens of the whole generation batch, per process and accumulation window
            tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                tokens = tokens * accumulation / self.args.steps_per_generation
            return total / tokens

        return aggregate

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        # TRL's forward: log π and H of every completion token in one pass (fused LM head)
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            **{key: inputs.get(key) for key in _FORWARD_KEYS})
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages[:, None].expand_as(logp)
        old_logp = inputs.get("old_per_token_logps")
        old_logp = logp.detach() if old_logp is None else old_logp
        is_ratio = (inputs.get("importance_sampling_ratio")
                    if self.use_vllm and self.vllm_importance_sampling_correction else None)
        kl = None
        if self.beta != 0.0:
            kl = kl_penalty(logp, inputs["ref_per_token_logps"], "k3")  # KL(π_θ‖π_ref), k3 estimator (§2.8)
            if self.args.use_bias_correction_kl:
                kl = kl * torch.exp(logp - old_logp)
        host_aggregate = self._aggregate(inputs, mode)

        def aggregate(loss_mat, bool_mask):
            if is_ratio is not None:
                loss_mat = loss_mat * is_ratio
            if kl is not None:
                loss_mat = loss_mat + self.beta * kl
            return host_aggregate(loss_mat, bool_mask)

        loss, metrics = self._aepo_loss(old_logp, logp, advantages, mask, config=self.aepo_loss_config,
                                        entropy=entropy, aggregate=aggregate)
        self._log_aepo_metrics(mode, metrics, entropy, kl, mask)
        return loss

    def _log_aepo_metrics(self, mode, metrics, entropy, kl, mask) -> None:
        """TRL's metric names where the quantity is the same, ``aepo/...`` for AEPO's own; each a
        mean over processes of the local masked means."""
        weight = mask.to(entropy.dtype)
        local = {"entropy": ((entropy.detach() * weight).sum() / weight.sum().clamp(min=1.0)).item()}
        if kl is not None:
            local["kl"] = ((kl.detach() * weight).sum() / weight.sum().clamp(min=1.0)).item()
        names = {"clip_ratio/low_mean": "actor/pg_clipfrac_lower_bound",
                 "clip_ratio/high_mean": "actor/pg_clipfrac_upper_bound",
                 "clip_ratio/region_mean": "actor/pg_clipfrac",
                 "aepo/dual_clip_frac": "actor/pg_clipfrac_lower",
                 "aepo/grad_preserved_frac": "actor/grad_preserved_frac",
                 "aepo/entropy_adv_scale_mean": "actor/entropy_adv_scale/mean"}
        local.update({ours: metrics[theirs] for ours, theirs in names.items()})
        values = torch.tensor(list(local.values()), device=self.accelerator.device)
        means = self.accelerator.gather(values[None]).mean(0).tolist()
        for name, value in zip(local, means):
            self._metrics[mode][name].append(value)
