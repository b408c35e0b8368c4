"""A trajectory exactly as the engine generated it (token-in, token-out; §1.1).

Tool-result tokens carry loss mask 0, log-prob 0 and entropy 0; every statistic downstream
(loss, entropy, advantage statistics) uses the mask.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ToolCall:
    name: str
    arg: str
    result: str
    """The text the model was shown (before truncation to ``rollout.max_tool_response_tokens``)."""
    error: bool = False
    """The call failed: the tool gave a :class:`~aepo_rl.tools.base.ToolError` (server down, HTTP
    error, sandbox stopped the code), raised, timed out, or the call was unusable (unknown tool,
    bad arguments); counted in ``rollout/tool_errors``."""


@dataclass
class Round:
    """One model segment (and the tool call that closed it, if any)."""

    start: int
    """Index of the segment's first token in ``response_token_ids``."""
    end: int
    step_entropy: float
    """Entropy of the segment's first k tokens (§1.2), as used for branching."""
    branch_probability: float | None = None
    """P_t computed after this round's tool result (None when no decision was made)."""
    tool_call: ToolCall | None = None


@dataclass
class Trajectory:
    prompt_id: str
    traj_id: int
    """Index within its prompt's group, in creation order."""
    parent_id: int | None
    """traj_id of the trajectory this one was forked from (None for a global sample)."""
    fork_token_index: int | None
    """Response tokens shared with the parent at the fork."""
    prompt_token_ids: list[int]
    response_token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    finish_reason: str = "running"
    """answer | eos | length | call_limit | empty_call | no_call | running"""
    response_text: str = ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [r.tool_call for r in self.rounds if r.tool_call is not None]

    @property
    def num_tool_calls(self) -> int:
        return len(self.tool_calls)

    @property
    def step_entropies(self) -> list[float]:
        return [r.step_entropy for r in self.rounds]

    def to_json(self) -> dict:
        """The rollouts.jsonl record: the fields above (rounds included), num_tool_calls, step_entropies."""
        out = asdict(self)
        out["num_tool_calls"] = self.num_tool_calls
        out["step_entropies"] = self.step_entropies
        return out
