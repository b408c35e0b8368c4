"""The tree rollout controller (docs/algorithm.md §1): global samples, tool rounds, forks, restarts.

Every round is one ``engine.generate`` call over every active sequence of every prompt.
After a round's tool results are appended, each trajectory that made a call may fork
(§1.4, §1.5): candidates are visited prompt by prompt in traj_id order until the prompt has
n trajectories; a prompt left with no active trajectory and fewer than n restarts a fresh
one. Modes: ``aepo`` (AEPO rule with the consecutive-branch penalty), ``arpo`` (ARPO rule),
``independent`` (GRPO: m = n, no branching). Validation: one greedy trajectory per prompt.

Which entropy drives a decision (``entropy_segment``, §1.2):
- ``latest`` (paper): the reaction to the latest tool result. Before the next round the
  controller forks a *shadow* of the candidate (a KV-cache copy, no compute), lets the
  candidate generate its reaction, measures it, and either keeps the shadow as the child
  (it resumes right after the tool result, so ``fork_token_index`` is that point) or frees it.
- ``previous`` (release): the segment that made the call; the child forks at once.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from dataclasses import dataclass, field

from aepo_rl.config import RolloutConfig
from aepo_rl.engines.base import GenerationEngine, SamplingParams
from aepo_rl.protocol import ANSWER_CLOSE, Protocol
from aepo_rl.rollout.entropy import branch_probability, premonitor_global_samples, step_entropy
from aepo_rl.rollout.metrics import BranchLog, rollout_metrics
from aepo_rl.rollout.tool_runner import ToolRunner
from aepo_rl.rollout.trajectory import Round, ToolCall, Trajectory
from aepo_rl.tools.base import Tool


@dataclass
class RolloutState:
    """What a tree rollout carries from one call to the next: the trainer owns it and saves it.

    ``slot_baselines`` (§1.4 release quirk, ``entropy_baseline="slot_persistent"``): the ΔH
    baseline of batch slot prompt_index·n + traj_id, set the first time the slot is measured
    and never reset.
    """

    slot_baselines: dict[int, float] = field(default_factory=dict)

    def state_dict(self) -> dict:
        return {"slot_baselines": dict(self.slot_baselines)}

    def load_state_dict(self, state: dict) -> None:
        self.slot_baselines = {int(slot): float(h) for slot, h in state["slot_baselines"].items()}


@dataclass
class RolloutResult:
    groups: list[list[Trajectory]]
    """Exactly n trajectories per prompt (1 in validation), in creation order."""
    metrics: dict[str, float]
    global_samples: list[int] = field(default_factory=list)
    """m per prompt: its first m trajectories are global samples; later roots are restarts (§1.5)."""
    branches: BranchLog = field(default_factory=BranchLog)
    """The branching decisions of the call (§1.4), each branch event with its prompt."""


def fork_copy(src: Trajectory, traj_id: int, point: int) -> Trajectory:
    """A child of ``src`` forked after its first ``point`` response tokens (§1.4): an exact copy of them (token
    ids with the tool result, loss mask, log-probs, entropies, rounds), recording its parent and fork point."""
    return Trajectory(prompt_id=src.prompt_id, traj_id=traj_id, parent_id=src.traj_id, fork_token_index=point,
                      prompt_token_ids=list(src.prompt_token_ids), response_token_ids=src.response_token_ids[:point],
                      loss_mask=src.loss_mask[:point], logprobs=src.logprobs[:point], entropies=src.entropies[:point],
                      rounds=[copy.deepcopy(r) for r in src.rounds if r.end <= point])


@dataclass
class _Live:
    """Controller state of one trajectory while it is generated."""

    traj: Trajectory
    group: int
    seq: int
    root_entropy: float | None = None
    """Lineage ΔH baseline (§1.4 default): step entropy of the root segment, inherited by forks."""
    streak: int = 0
    """l: consecutive branching steps on this path (penalty_scope="path")."""
    active: bool = True
    after_tool: bool = False
    """The last round appended a tool result, so the point after it is a branching candidate."""
    shadow: int | None = None
    shadow_point: int = 0


class _TreeRollout:
    def __init__(self, engine: GenerationEngine, tools: dict[str, Tool], cfg: RolloutConfig,
                 params: SamplingParams, rng: random.Random, state: RolloutState):
        self.engine, self.tools, self.cfg, self.params, self.rng = engine, tools, cfg, params, rng
        self.state = state
        self.tok = engine.tokenizer
        self.runner = ToolRunner(tools, cfg.tool_workers, cfg.tool_timeout)
        self.protocol = Protocol(tools, cfg.tool_format)
        prefix, suffix = self.protocol.result_wrapping(self.tok)
        self.result_prefix, self.result_suffix = self._encode(prefix), self._encode(suffix)
        self.branches = BranchLog()

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    # -- building blocks -------------------------------------------------------------------
    def _start(self, groups, lives, g: int, prompt: tuple[str, list[int]]) -> None:
        traj = Trajectory(prompt_id=prompt[0], traj_id=len(groups[g]), parent_id=None,
                          fork_token_index=None, prompt_token_ids=list(prompt[1]))
        groups[g].append(traj)
        lives.append(_Live(traj, g, self.engine.add_sequence(list(prompt[1]))))

    def _fork(self, groups, lives, parent: _Live, seq: int, point: int) -> None:
        child = fork_copy(parent.traj, len(groups[parent.group]), point)
        groups[parent.group].append(child)
        lives.append(_Live(child, parent.group, seq, root_entropy=parent.root_entropy, streak=parent.streak))

    def _finish(self, live: _Live, reason: str) -> None:
        live.traj.finish_reason, live.active = reason, False
        self.engine.release(live.seq)

    def _free_shadow(self, live: _Live) -> None:
        if live.shadow is not None:
            self.engine.release(live.shadow)
            live.shadow = None

    # -- one round -------------------------------------------------------------------------
    def _generate_round(self, live: list[_Live], reduce: str) -> None:
        """Generate a segment for every active trajectory, then run and append the tool calls; step
        entropies (§1.2) with the reduction ``reduce``."""
        cfg, budget = self.cfg, self.cfg.max_response_length
        max_new = [min(cfg.max_tokens_per_round, budget - len(x.traj.response_token_ids)) for x in live]
        segments = self.engine.generate([x.seq for x in live], self.params, max_new)
        calls = []
        for x, seg in zip(live, segments):
            traj = x.traj
            h = step_entropy(seg, cfg.entropy_measure, cfg.entropy_k_tokens, self.engine.vocab_size, reduce)
            start = len(traj.response_token_ids)
            traj.response_token_ids += seg.token_ids
            traj.loss_mask += [1] * len(seg.token_ids)
            traj.logprobs += seg.logprobs
            traj.entropies += seg.entropies
            traj.rounds.append(Round(start=start, end=len(traj.response_token_ids), step_entropy=h))
            if x.root_entropy is None:
                x.root_entropy = h
            x.after_tool = False
            if seg.finish_reason == "stop" and seg.stop_string == ANSWER_CLOSE:
                self._finish(x, "answer")
            elif seg.finish_reason == "stop":
                text = self.tok.decode(seg.token_ids, skip_special_tokens=False)
                request = self.protocol.parse_call(text, seg.stop_string)
                if request is None:
                    self._finish(x, "empty_call")
                elif len(traj.response_token_ids) >= budget:  # no room left for the result
                    self._finish(x, "length")
                elif traj.num_tool_calls >= cfg.call_limit:
                    self._finish(x, "call_limit")
                else:
                    calls.append((x, request))
            elif seg.finish_reason == "eos":
                self._finish(x, "eos")
            else:
                self._finish(x, "length" if len(traj.response_token_ids) >= budget else "no_call")
        results = self.runner.run([request for _, request in calls])
        for (x, request), (output, is_error) in zip(calls, results):
            traj = x.traj
            body = self._encode(output)[:cfg.max_tool_response_tokens]
            ids = (self.result_prefix + body + self.result_suffix)[:budget - len(traj.response_token_ids)]
            traj.response_token_ids += ids
            traj.loss_mask += [0] * len(ids)
            traj.logprobs += [0.0] * len(ids)
            traj.entropies += [0.0] * len(ids)
            last = traj.rounds[-1]
            last.end = len(traj.response_token_ids)
            last.tool_call = ToolCall(name=request.name, arg=request.arg, result=output, error=is_error)
            if len(traj.response_token_ids) >= budget:
                self._finish(x, "length")
            else:
                self.engine.append(x.seq, ids)
                x.after_tool = True

    def _branch(self, groups, lives, candidates: list[_Live], n: int, counters: list[int], gained: set[int]) -> None:
        """§1.4: P_t per candidate (prompt, traj_id order); fork Z children iff P_t ≥ τ until n."""
        cfg = self.cfg
        latest = cfg.entropy_segment == "latest"
        for x in sorted(candidates, key=lambda c: (c.group, c.traj.traj_id)):
            if len(groups[x.group]) >= n:
                self._free_shadow(x)
                continue
            traj = x.traj
            h = traj.rounds[-1].step_entropy
            # latest: the decision is about the point after the previous round's tool result.
            point = x.shadow_point if latest else len(traj.response_token_ids)
            decided = traj.rounds[-2] if latest else traj.rounds[-1]
            if cfg.entropy_baseline == "slot_persistent":
                base = self.state.slot_baselines[x.group * n + traj.traj_id]
            else:
                base = x.root_entropy
            delta = h - base  # ΔH on the release's scale (§1.4)
            streak = x.streak if cfg.penalty_scope == "path" else counters[x.group]
            uniform = self.rng.random()
            rule = dict(mode=cfg.mode, entropy_weight=cfg.entropy_weight, penalty=cfg.branch_penalty)
            p = branch_probability(uniform, delta, streak, **rule)
            p_without_entropy = branch_probability(uniform, 0.0, streak, **rule)  # for the entropy leverage
            decided.branch_probability = p
            log = self.branches
            log.decisions += 1
            log.entropy_flips += (p >= cfg.branch_threshold) != (p_without_entropy >= cfg.branch_threshold)
            if p >= cfg.branch_threshold:
                log.streaks.append(streak)
                log.streak_groups.append(x.group)
                if cfg.penalty_scope == "path":  # children inherit the incremented count
                    x.streak += 1
                    log.consecutive_max = max(log.consecutive_max, x.streak)
                children = min(cfg.branch_factor, n - len(groups[x.group]))
                source = x.shadow if latest else x.seq
                for i in range(children):
                    last_shadow = latest and i == children - 1
                    self._fork(groups, lives, x, source if last_shadow else self.engine.fork(source), point)
                x.shadow = None
                gained.add(x.group)
            else:
                x.streak = 0
                self._free_shadow(x)

    # -- the whole tree --------------------------------------------------------------------
    def grow(self, prompts: list[tuple[str, list[int]]], global_samples: list[int], n: int,
             branching: bool, reduce: str) -> list[list[Trajectory]]:
        cfg = self.cfg
        latest = cfg.entropy_segment == "latest"
        groups: list[list[Trajectory]] = [[] for _ in prompts]
        lives: list[_Live] = []
        for g, prompt in enumerate(prompts):
            for _ in range(global_samples[g]):
                self._start(groups, lives, g, prompt)
        counters = [0] * len(prompts)  # c per prompt (penalty_scope="prompt_round"), reset every call
        while True:
            live = [x for x in lives if x.active]
            if not live:
                break
            if branching and latest:
                for x in live:
                    if x.after_tool and len(groups[x.group]) < n:
                        x.shadow, x.shadow_point = self.engine.fork(x.seq), len(x.traj.response_token_ids)
            self._generate_round(live, reduce)
            gained: set[int] = set()
            if branching:
                if cfg.entropy_baseline == "slot_persistent":
                    baselines = self.state.slot_baselines
                    for x in live:
                        baselines.setdefault(x.group * n + x.traj.traj_id, x.traj.rounds[-1].step_entropy)
                if latest:
                    candidates = [x for x in live if x.shadow is not None]
                else:
                    candidates = [x for x in live if x.after_tool]
                self._branch(groups, lives, candidates, n, counters, gained)
            for g, prompt in enumerate(prompts):
                if len(groups[g]) < n and not any(x.active for x in lives if x.group == g):
                    for _ in range(1 if cfg.restarts else n - len(groups[g])):
                        self._start(groups, lives, g, prompt)
                    gained.add(g)
            if gained:
                counters = [c + 1 if g in gained else 0 for g, c in enumerate(counters)]
                if cfg.penalty_scope == "prompt_round":
                    self.branches.consecutive_max = max(self.branches.consecutive_max, *counters)
        for traj in (t for group in groups for t in group):
            traj.response_text = self.tok.decode(traj.response_token_ids, skip_special_tokens=False)
        return groups

    def premonitor_probes(self, prompts: list[tuple[str, list[int]]]) -> list[tuple[float, Trajectory]]:
        """§1.3's two probes per prompt: H_root of a root probe and one complete tool-using rollout.

        Their step entropies are sums over k tokens / ln|V| (the release's scale) whatever
        ``rollout.entropy_reduce``, which sets the reduction of ΔH only."""
        cfg = self.cfg
        seqs = [self.engine.add_sequence(list(ids)) for _, ids in prompts]
        probes = self.engine.generate(seqs, self.params, [cfg.premonitor_probe_tokens] * len(seqs))
        for seq in seqs:
            self.engine.release(seq)
        h_roots = [step_entropy(s, cfg.entropy_measure, cfg.entropy_k_tokens, self.engine.vocab_size, "sum")
                   for s in probes]
        pre = self.grow(prompts, [1] * len(prompts), 1, branching=False, reduce="sum")
        return [(h_root, traj) for h_root, (traj,) in zip(h_roots, pre)]

    def premonitor(self, prompts: list[tuple[str, list[int]]], n: int) -> list[int]:
        """§1.3: m per prompt from the two probes (both discarded)."""
        cfg = self.cfg
        return [premonitor_global_samples(n, h_root, tool_entropy(traj, h_root, cfg.premonitor_formula),
                                          formula=cfg.premonitor_formula, beta=cfg.premonitor_beta)
                for h_root, traj in self.premonitor_probes(prompts)]

    def extend(self, trajectories: list[Trajectory]) -> None:
        """Generate partial trajectories (each a copy of a prefix that ends right after a tool result) to
        their end, without branching."""
        lives = [_Live(t, i, self.engine.add_sequence(t.prompt_token_ids + t.response_token_ids))
                 for i, t in enumerate(trajectories)]
        while live := [x for x in lives if x.active]:
            self._generate_round(live, self.cfg.entropy_reduce)
        for traj in trajectories:
            traj.response_text = self.tok.decode(traj.response_token_ids, skip_special_tokens=False)

    def close(self) -> None:
        self.runner.close()


def tool_entropy(traj: Trajectory, h_root: float, formula: str) -> float:
    """H_tool_avg of §1.3 from the pre-rollout ``traj``: the mean step entropy of its segments after a tool
    result (``paper``) or of all its segments (``release``); ``h_root`` when it made no call."""
    steps = traj.rounds if formula == "release" else traj.rounds[1:]
    return sum(r.step_entropy for r in steps) / len(steps) if traj.num_tool_calls and steps else h_root


def _sampling(cfg: RolloutConfig, tools: dict[str, Tool], validation: bool,
              sampling: SamplingParams | None) -> SamplingParams:
    stops = Protocol(tools, cfg.tool_format).stop_strings()
    if sampling is None:
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, greedy=validation,
                                  min_p=cfg.min_p, repetition_penalty=cfg.repetition_penalty,
                                  min_tokens=cfg.min_tokens, ignore_eos=cfg.ignore_eos)
    return dataclasses.replace(sampling, stop=tuple(dict.fromkeys(tuple(sampling.stop) + stops)))


def run_rollout(engine: GenerationEngine, prompts: list[tuple[str, list[int]]], tools: dict[str, Tool],
                cfg: RolloutConfig, *, validation: bool = False, sampling: SamplingParams | None = None,
                seed: int | None = None, state: RolloutState | None = None,
                rng: random.Random | None = None) -> RolloutResult:
    """Roll out ``prompts`` (prompt_id, prompt token ids) into groups of n trajectories (§1).

    m = ``cfg.global_samples`` if set; else entropy pre-monitoring (§1.3) in aepo mode with
    ``cfg.premonitor``; else n // 2 (at least 1); n in independent mode. ``validation``: one
    trajectory per prompt, no branching, greedy unless ``sampling`` says otherwise. ``seed``
    (default ``cfg.seed``) seeds the uniform draws U of §1.4; ``rng`` (anything with ``random()``)
    supplies them instead. ``state``: what carries over between calls (the trainer's, so the
    release-quirk baselines persist across RL steps); default a fresh one.
    """
    for pid, ids in prompts:
        if not ids or len(ids) > cfg.max_prompt_length:
            raise ValueError(f"prompt '{pid}' has {len(ids)} tokens; it needs 1 to rollout.max_prompt_length="
                             f"{cfg.max_prompt_length} (raise that limit or shorten the prompt)")
    n = 1 if validation else cfg.n
    branching = not validation and cfg.mode in ("aepo", "arpo") and n > 1
    if rng is None:
        rng = random.Random(cfg.seed if seed is None else seed)
    tree = _TreeRollout(engine, tools, cfg, _sampling(cfg, tools, validation, sampling), rng,
                        state if state is not None else RolloutState())
    counters_before = dict(engine.stats())
    t0 = time.perf_counter()
    try:
        if not branching:
            ms = [n] * len(prompts)
        elif cfg.global_samples is not None:
            ms = [min(n, cfg.global_samples)] * len(prompts)
        elif cfg.mode == "aepo" and cfg.premonitor:
            ms = tree.premonitor(prompts, n)
        else:
            ms = [max(1, n // 2)] * len(prompts)
        groups = tree.grow(prompts, ms, n, branching, cfg.entropy_reduce)
    finally:
        tree.close()
    seconds = time.perf_counter() - t0
    counters = {k: v - counters_before.get(k, 0.0) for k, v in engine.stats().items()}
    return RolloutResult(groups, rollout_metrics(groups, ms, tree.branches, counters, seconds), ms, tree.branches)


def premonitor_probes(engine: GenerationEngine, prompts: list[tuple[str, list[int]]], tools: dict[str, Tool],
                      cfg: RolloutConfig, *, seed: int | None = None) -> list[tuple[float, Trajectory]]:
    """§1.3's probes of each prompt, as a tree rollout in aepo mode runs them: H_root and the pre-rollout
    trajectory (its H_tool_avg is :func:`tool_entropy`'s), sampled with ``cfg``'s training settings."""
    tree = _TreeRollout(engine, tools, cfg, _sampling(cfg, tools, False, None),
                        random.Random(cfg.seed if seed is None else seed), RolloutState())
    try:
        return tree.premonitor_probes(prompts)
    finally:
        tree.close()


def continue_rollout(engine: GenerationEngine, trajectories: list[Trajectory], tools: dict[str, Tool],
                     cfg: RolloutConfig, *, sampling: SamplingParams | None = None) -> None:
    """Generate each partial trajectory to its end in place, in one batch per round and without branching,
    as a child forked at its last token would be (§1.4, §1.5): a copy of a parent's first
    ``fork_token_index`` response tokens, which end right after a tool result."""
    tree = _TreeRollout(engine, tools, cfg, _sampling(cfg, tools, False, sampling), random.Random(cfg.seed),
                        RolloutState())
    try:
        tree.extend(trajectories)
    finally:
        tree.close()
