"""verl's custom reward function, backed by :mod:`aepo_rl.rewards` (docs/algorithm.md §3).

Give it to verl with ``reward.custom_reward_function.path=<this file>`` and
``reward.custom_reward_function.name=compute_score``. verl decodes each response with
``skip_special_tokens=True``; the tool protocol's tags are ordinary text, so the format check and the
tool accounting of §3 see them. The reward is ``extra_info["reward"]`` (``aepo verl-data`` writes the
task's reward there), else the data source's default. Needs no verl.
"""

from __future__ import annotations

from aepo_rl import rewards


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """The §3 score of one decoded response; extra keyword arguments verl may add are ignored."""
    return rewards.compute_score(data_source, solution_str, ground_truth, dict(extra_info or {}))
