"""The ``aepo`` and ``gppo`` policy losses of verl's policy-loss registry, and the entropy they need.

Both compute the per-token loss with aepo_rl's own core (:mod:`aepo_rl.algorithms.losses`: §2.2
entropy-aware advantage, §2.3 clipped surrogate with the stop-gradient upper bound, §4.6 GPPO) and
hand the loss matrix to verl's ``agg_loss`` with ``config.global_batch_info``, so the aggregation
(§2.5) is verl's, normalised over the global batch across data-parallel ranks.

Entropy. verl 0.9.1's ``ppo_loss`` computes the current policy's token entropies (when
``actor.calculate_entropy=true``) but does not pass them to policy-loss functions. The plugin rebinds
verl's ``ppo_loss`` to a wrapper (:mod:`.plugin`) that, for ``loss_mode`` aepo/gppo, calls
:func:`ppo_loss_with_entropy`: verl's own ``ppo_loss`` with the padded, detached entropies in a
:class:`contextvars.ContextVar` for the duration of the call, where the registered loss reads them.
The plugin registers the losses itself (:data:`POLICY_LOSSES`) and loads this module on their first call.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from aepo_rl.integrations.verl import require_verl

require_verl()

from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config.actor import PolicyLossConfig  # noqa: E402
from verl.workers.utils.padding import no_padding_2_padding  # noqa: E402

from aepo_rl.algorithms.losses import aepo_policy_loss, gppo_policy_loss  # noqa: E402
from aepo_rl.config import AlgorithmConfig  # noqa: E402

VERL_SCOPES = ("micro-batch",)

_ENTROPY: contextvars.ContextVar = contextvars.ContextVar("aepo_verl_entropy", default=None)


@dataclass
class AEPOPolicyLossConfig(PolicyLossConfig):
    """verl's ``actor.policy_loss`` with AEPO's knobs; select it with
    ``actor_rollout_ref.actor.policy_loss._target_=aepo_rl.integrations.verl.loss.AEPOPolicyLossConfig``
    and set a knob with a leading ``+`` (``+actor_rollout_ref.actor.policy_loss.entropy_adv_coef=0.2``).

    entropy_adv_coef: a of Ã = A·(1 + a·z) (§2.2); 0 turns it off (then no entropy is needed).
    entropy_adv_scope: where mean H and std H come from (§2.6); verl's loss sees one micro-batch,
        so only ``micro-batch`` (the release's) is available here.
    entropy_adv_clamp: clamp 1 + a·z at 0 (§2.2).
    sg_upper_clip: the upper clip bound keeps its gradient, (1+ε_h)·r/sg(r) (§2.3); false = PPO's clip.
    grad_preserve_entropy_quantile: keep that gradient only for tokens at or above this entropy
        quantile of the micro-batch (§2.3, paper); None = every token (release).
    """

    entropy_adv_coef: float = 0.2
    entropy_adv_scope: str = "micro-batch"
    entropy_adv_clamp: bool = False
    sg_upper_clip: bool = True
    grad_preserve_entropy_quantile: float | None = None

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        key = "actor_rollout_ref.actor.policy_loss"
        if self.entropy_adv_coef < 0:
            raise ValueError(f"{key}.entropy_adv_coef must be >= 0, got {self.entropy_adv_coef}")
        if self.entropy_adv_scope not in VERL_SCOPES:
            raise ValueError(f"{key}.entropy_adv_scope={self.entropy_adv_scope!r} is not available under verl: its "
                             "policy loss sees one micro-batch at a time; use micro-batch (docs/verl.md)")
        q = self.grad_preserve_entropy_quantile
        if q is not None and not 0 <= q <= 1:
            raise ValueError(f"{key}.grad_preserve_entropy_quantile must be in [0, 1] or null, got {q}")


def _knobs(policy_loss) -> dict:
    """AEPO's knobs from ``actor.policy_loss``: the subclass's values, else its defaults."""
    defaults = AEPOPolicyLossConfig()
    names = ("entropy_adv_coef", "entropy_adv_scope", "entropy_adv_clamp", "sg_upper_clip",
             "grad_preserve_entropy_quantile")
    return {name: policy_loss.get(name, getattr(defaults, name)) if policy_loss is not None else getattr(defaults, name)
            for name in names}


def algorithm_config(config) -> AlgorithmConfig:
    """aepo_rl's loss settings from verl's ``ActorConfig``: clip bounds (``clip_ratio_low/high`` falling
    back to ``clip_ratio``, as verl does), dual clip ``clip_ratio_c`` and AEPO's knobs."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return AlgorithmConfig(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=config.get("clip_ratio_c", 3.0),
                           loss_scale_factor=config.get("loss_scale_factor", None),
                           **_knobs(config.get("policy_loss", None)))


def _aggregate(config, loss_agg_mode: str, rollout_is_weights):
    """verl's ``agg_loss`` over the global batch (§2.5), after verl's rollout-correction weights."""
    batch_info = dict(config.get("global_batch_info", None) or {})

    def aggregate(loss_mat, mask):
        if rollout_is_weights is not None:
            loss_mat = loss_mat * rollout_is_weights
        return core_algos.agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **batch_info)

    return aggregate


def _fp32(*tensors):
    """Upcast (differentiably) what verl hands over in its compute dtype: under bf16 mixed precision the
    log-probs and entropies arrive bf16, and the ratio and the entropy statistics of §2.2 computed in
    bf16 drift (review M3: masked mean of 1 + a·z measured 0.81 instead of 1)."""
    return tuple(t.float() for t in tensors)


def aepo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
              rollout_is_weights=None):
    """AEPO (§2.2 + §2.3) with verl's policy-loss signature; the entropy comes from :func:`ppo_loss`."""
    if config is None:
        raise ValueError("aepo loss: verl passes the ActorConfig as config=; got None")
    cfg = algorithm_config(config)
    entropy = _ENTROPY.get()
    if entropy is None and (cfg.entropy_adv_coef > 0 or cfg.grad_preserve_entropy_quantile is not None):
        raise ValueError("loss_mode=aepo with policy_loss.entropy_adv_coef > 0 (or "
                         "grad_preserve_entropy_quantile) needs the current policy's token "
                         "entropies: set actor_rollout_ref.actor.calculate_entropy=true "
                         "(or +actor_rollout_ref.actor.policy_loss.entropy_adv_coef=0), "
                         "and check that the aepo-rl verl plugin is loaded (docs/verl.md)")
    old_log_prob, log_prob, advantages = _fp32(old_log_prob, log_prob, advantages)
    return aepo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, cfg, entropy,
                            aggregate=_aggregate(config, loss_agg_mode, rollout_is_weights))


def gppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
              rollout_is_weights=None):
    """GPPO (§4.6): both clip bounds gradient-preserving, dual clip kept; verl's signature."""
    if config is None:
        raise ValueError("gppo loss: verl passes the ActorConfig as config=; got None")
    old_log_prob, log_prob, advantages = _fp32(old_log_prob, log_prob, advantages)
    return gppo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, algorithm_config(config),
                            aggregate=_aggregate(config, loss_agg_mode, rollout_is_weights))


POLICY_LOSSES = {"aepo": aepo_loss, "gppo": gppo_loss}
"""What the plugin's registered ``aepo``/``gppo`` entries call (one per name of LOSS_MODES)."""


def ppo_loss_with_entropy(verl_ppo_loss, config, model_output, data, dp_group=None):
    """verl's ``ppo_loss`` with the current entropies made visible to the aepo/gppo losses (detached:
    the entropy-aware advantage passes no gradient through H, §2.2)."""
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data).detach().float()  # fp32 statistics (see _fp32)
    token = _ENTROPY.set(entropy)
    try:
        return verl_ppo_loss(config, model_output, data, dp_group)
    finally:
        _ENTROPY.reset(token)
