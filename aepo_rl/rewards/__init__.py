"""Rewards on decoded responses (model text and the environment's result blocks), docs/algorithm.md §3.

- :mod:`~aepo_rl.rewards.scores`: answer extraction, token F1 and exact match, and the registered rewards
  (deep_research, f1, exact_match, answer_list_em/f1, math); :func:`get_reward` looks one up by name.
- :mod:`~aepo_rl.rewards.judge`: the ``llm_judge`` reward, an OpenAI-compatible endpoint as the grader.
- :mod:`~aepo_rl.rewards.batched`: reward functions of TRL's convention and :class:`WeightedRewards`.

verl's ``compute_score`` is :mod:`aepo_rl.integrations.verl.reward`.
"""

from aepo_rl.rewards.batched import (
                                     GOLD_COLUMNS,
                                     RewardFunc,
                                     RewardFunctionError,
                                     RewardSetupError,
                                     WeightedRewards,
                                     completion_text,
                                     function_name,
                                     prompt_question,
                                     reads_answer,
                                     reward_function,
)
from aepo_rl.rewards.judge import JudgeUnavailableError, LLMJudge, parse_verdict
from aepo_rl.rewards.scores import (
                                     ANSWER_SEP,
                                     FORMAT_PENALTY,
                                     MULTI_TOOL_BONUS,
                                     Reward,
                                     answer_list_em_reward,
                                     answer_list_f1_reward,
                                     answer_list_scores,
                                     answer_set,
                                     deep_research_reward,
                                     exact_match_reward,
                                     extract_answer,
                                     f1_reward,
                                     get_reward,
                                     gold_answers,
                                     is_exact_match,
                                     math_reward,
                                     max_f1,
                                     normalize_answer,
                                     token_f1,
)

__all__ = ["ANSWER_SEP", "FORMAT_PENALTY", "GOLD_COLUMNS", "MULTI_TOOL_BONUS", "JudgeUnavailableError", "LLMJudge",
           "Reward", "RewardFunc", "RewardFunctionError", "RewardSetupError", "WeightedRewards",
           "answer_list_em_reward", "answer_list_f1_reward", "answer_list_scores", "answer_set", "completion_text",
           "deep_research_reward", "exact_match_reward", "extract_answer", "f1_reward", "function_name",
           "get_reward", "gold_answers", "is_exact_match", "math_reward", "max_f1", "normalize_answer",
           "parse_verdict", "prompt_question", "reads_answer", "reward_function", "token_f1"]
