"""verl's custom reward function, backed by :mod:`aepo_rl.rewards` (docs/algorithm.md §3).

Give it to verl with ``reward.custom_reward_function.path=<this file>`` and
``reward.custom_reward_function.name=compute_score``. verl decodes each response with
``skip_special_tokens=True``; the tool protocol's tags are ordinary text, so the format check and the
tool accounting of §3 see them. The reward is ``extra_info["reward"]`` (``aepo verl-data`` writes the
task's reward there), else the data source's default. Needs no verl.
"""

from __future__ import annotations

from aepo_rl.config import TaskConfig
from aepo_rl.rewards import get_reward, gold_answers
from aepo_rl.tasks.loaders import default_reward


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """The §3 score of one decoded response: the reward ``extra_info["reward"]`` when given, else the default of
    the data source's evaluation set (math sets: math; others: deep_research). Extra keyword arguments verl may
    add are ignored."""
    extra_info = dict(extra_info or {})
    name = extra_info.get("reward") or default_reward(data_source)
    reward = get_reward(name, judge_url=extra_info.get("judge_url"),
                        judge_model=extra_info.get("judge_model", TaskConfig.judge_model))
    return float(reward(solution_str, gold_answers(ground_truth), extra_info.get("question", "")))
