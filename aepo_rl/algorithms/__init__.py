"""Pure-tensor algorithm core: policy losses (§2.3, §4), advantage estimators (§2.1, §4), the
entropy-aware advantage (§2.2), loss aggregation, KL and entropy terms, and DAPO helpers."""

from ..config import AlgorithmConfig as PolicyLossConfig
from .advantages import ADVANTAGE_ESTIMATORS, get_advantage_estimator, register_advantage_estimator
from .aggregation import AGG_MODES, AGG_SCOPES, agg_loss, micro_batch_weight
from .dapo import filter_groups, overlong_penalty
from .entropy_adv import entropy_adv_scale, entropy_stats
from .kl import entropy_bonus, entropy_from_logits, kl_penalty
from .losses import POLICY_LOSSES, clipped_surrogate, get_policy_loss, high_entropy_shares, register_policy_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGG_MODES", "AGG_SCOPES", "POLICY_LOSSES", "PolicyLossConfig", "agg_loss",
    "clipped_surrogate", "entropy_adv_scale", "entropy_bonus", "entropy_from_logits", "entropy_stats", "filter_groups",
    "get_advantage_estimator", "get_policy_loss", "high_entropy_shares", "kl_penalty", "micro_batch_weight",
    "overlong_penalty", "register_advantage_estimator", "register_policy_loss",
]
