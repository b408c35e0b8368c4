r"""A reward in one file: 1 when the ``\boxed{}`` answer is a number equal to a gold answer, else 0.

Rewards are ``fn(response, answers, question="") -> float`` on the decoded response. ``binary=True``
declares that the score is 1 exactly when the answer is right, so evaluation (pass@k) reads it as
the verdict. Run it with

    aepo --plugin examples/plugins/my_reward.py train task.reward=numeric_match
"""

from aepo_rl.registry import register_reward
from aepo_rl.rewards import extract_answer


def as_number(text: str | None) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except (AttributeError, ValueError):
        return None


@register_reward("numeric_match", binary=True)
def numeric_match_reward(response: str, answers: list[str], question: str = "") -> float:
    predicted = as_number(extract_answer(response))
    return float(predicted is not None and any(predicted == as_number(gold) for gold in answers))
