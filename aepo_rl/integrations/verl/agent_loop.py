"""AEPO's tree rollout as verl agent loops: ``aepo_tree`` (training) and ``aepo_chain`` (validation).

verl's V1 agent-loop worker runs the n sessions of one prompt as asyncio tasks of one event loop,
each a fresh agent-loop instance whose ``run()`` returns one trajectory. ``aepo_tree`` makes those n
sessions the n leaves of one tree (docs/algorithm.md §1): the worker's :class:`TreeCoordinator` (one per
event loop, the only state the loops share) keeps the trees by ``(uid, global_steps)``, starts a tree
when its first session arrives, runs aepo_rl's own
controller (:func:`aepo_rl.rollout.tree.run_rollout`, one prompt, n leaves) in a thread over
:class:`VerlServerEngine`, and hands leaf i to session i. All n leaves are final outputs of the
prompt's uid, so verl's GRPO groups them together (§2.1).

:class:`VerlServerEngine` is a :class:`~aepo_rl.engines.base.GenerationEngine` over verl's
``LLMServerClient``: it keeps each sequence's token ids and sends the whole context with every
request, under the prompt's uid as request id, so verl's router sends every branch of a tree to
the same server replica, whose prefix cache serves the shared context (§1.5). verl's servers
return the sampled tokens' log-probs only (no top-k), so branching uses the ``surprisal`` step
entropy (§1.2). Tool results are appended as token ids with response mask 0; nothing is
re-tokenised: the leaves' ids are the ids the server generated and the tool results' ids.

The tree's knobs are ``actor_rollout_ref.rollout.custom.aepo.*`` (docs/verl.md). The plugin registers
both loops by name (:data:`aepo_rl.integrations.verl.AGENT_LOOPS`), so verl imports this module only in
the agent-loop workers that build one.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import warnings
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from aepo_rl.integrations.verl import require_verl

require_verl()

from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput  # noqa: E402

from aepo_rl.config import ConfigError, RolloutConfig, TaskConfig, load_config  # noqa: E402
from aepo_rl.engines.base import SamplingParams, Segment  # noqa: E402
from aepo_rl.engines.sequences import SequenceTable, TokenLists  # noqa: E402
from aepo_rl.engines.stops import REPLACEMENT_CHAR  # noqa: E402
from aepo_rl.rollout.trajectory import Trajectory  # noqa: E402

logger = logging.getLogger(__name__)

CUSTOM_KEY = "actor_rollout_ref.rollout.custom.aepo"
FROM_VERL = {"n": "actor_rollout_ref.rollout.n", "temperature": "actor_rollout_ref.rollout.temperature",
             "top_p": "actor_rollout_ref.rollout.top_p", "top_k": "actor_rollout_ref.rollout.top_k",
             "max_prompt_length": "actor_rollout_ref.rollout.prompt_length",
             "max_response_length": "actor_rollout_ref.rollout.response_length",
             "logprobs_mode": "actor_rollout_ref.rollout.logprobs_mode"}
"""RolloutConfig knobs that verl's own keys set (custom.aepo.<name> is refused for them)."""
ENGINE_ONLY = {name for name in (f.name for f in fields(RolloutConfig))
               if name.startswith(("engine", "vllm_")) or name in ("seed", "tool_error_warn_share")}
ROLLOUT_KEYS = sorted(f.name for f in fields(RolloutConfig) if f.name not in FROM_VERL and f.name not in ENGINE_ONLY)
EXTRA_KEYS = ("task", "tools", "tree_timeout", "max_concurrent_trees")
DEFAULT_TREE_TIMEOUT = 3600.0


# ---------------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class AEPOLoopSettings:
    """``custom.aepo`` resolved: aepo_rl's RolloutConfig, the task config its tools come from, the tool tags."""

    rollout: RolloutConfig
    task: TaskConfig
    tools: tuple[str, ...] | None
    tree_timeout: float
    max_concurrent_trees: int


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def loop_settings(rollout_config) -> AEPOLoopSettings:
    """Resolve ``rollout.custom.aepo`` against aepo_rl's config (its ranges and choices); errors name
    the key under ``actor_rollout_ref.rollout.custom.aepo`` and the fix."""
    custom = _plain(rollout_config.get("custom", None) or {}) or {}
    aepo = dict(custom.get("aepo", None) or {})
    overrides: dict[str, Any] = {"rollout.entropy_measure": "surprisal", "rollout.mode": "aepo"}
    for name, key in FROM_VERL.items():
        if name in aepo:
            raise ConfigError(f"{CUSTOM_KEY}.{name} is set by verl's own key; use {key} instead")
    unknown = sorted(set(aepo) - set(ROLLOUT_KEYS) - set(EXTRA_KEYS))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(f'{CUSTOM_KEY}.{k}' for k in unknown)}; valid keys: "
                          f"{', '.join(ROLLOUT_KEYS + list(EXTRA_KEYS))} (docs/verl.md)")
    for name in ROLLOUT_KEYS:
        if name in aepo:
            overrides[f"rollout.{name}"] = aepo[name]
    overrides["rollout.n"] = int(rollout_config.get("n", 1))
    overrides["rollout.max_prompt_length"] = int(rollout_config.prompt_length)
    overrides["rollout.max_response_length"] = int(rollout_config.response_length)
    task = aepo.get("task", None) or {}
    if not isinstance(task, dict):
        raise ConfigError(f"{CUSTOM_KEY}.task must be a mapping of aepo task keys (name, search_url, corpus, …), "
                          f"got {task!r}")
    for name, value in task.items():
        overrides[f"task.{name}"] = value
    try:
        cfg = load_config("aepo", None, overrides)
    except ConfigError as error:  # name the keys as the user wrote them
        message = re.sub(r"(?<![\w.])rollout\.", f"{CUSTOM_KEY}.", str(error))
        raise ConfigError(re.sub(r"(?<![\w.])task\.", f"{CUSTOM_KEY}.task.", message)) from None
    if cfg.rollout.entropy_measure != "surprisal":
        raise ConfigError(f"{CUSTOM_KEY}.entropy_measure={cfg.rollout.entropy_measure} needs per-token entropies "
                          "that verl's servers do not return (they give the sampled token's log-prob only); "
                          "use surprisal (docs/verl.md)")
    if cfg.rollout.entropy_baseline == "slot_persistent":
        raise ConfigError(f"{CUSTOM_KEY}.entropy_baseline=slot_persistent keeps state across steps, which verl's "
                          "per-prompt agent loops do not have; use lineage")
    tools = aepo.get("tools", None)
    if tools is not None:
        tools = tuple([tools] if isinstance(tools, str) else tools)
    timeout = float(aepo.get("tree_timeout", DEFAULT_TREE_TIMEOUT))
    concurrency = int(aepo.get("max_concurrent_trees", 64))
    if timeout <= 0 or concurrency < 1:
        raise ConfigError(f"{CUSTOM_KEY}.tree_timeout must be > 0 and max_concurrent_trees >= 1")
    return AEPOLoopSettings(cfg.rollout, cfg.task, tools, timeout, concurrency)


def build_tools(settings: AEPOLoopSettings, split: str = "train") -> dict:
    """The task's tools by tag for the questions of ``split`` (:func:`aepo_rl.tasks.base.split_tools`: the
    validation loop's questions are the task's dev split, which phantomwiki searches in its own universe);
    only the tags of ``custom.aepo.tools`` when it is set. :meth:`TreeCoordinator.tools` keeps them per
    worker (the synthetic task's search index is not free)."""
    from aepo_rl.tasks import get_task
    from aepo_rl.tasks.base import split_tools

    task, tags = settings.task, settings.tools
    cfg = load_config("aepo", None, {**{f"task.{name}": value for name, value in asdict(task).items()},
                                     **_tool_knobs(settings)})
    tools = split_tools(get_task(cfg), split)
    if tags is not None:
        missing = [t for t in tags if t not in tools]
        if missing:
            raise ConfigError(f"{CUSTOM_KEY}.tools names {missing}, which task '{task.name}' does not have; "
                              f"its tools: {sorted(tools)}")
        tools = {t: tools[t] for t in tags}
    return tools


def _tool_knobs(settings: AEPOLoopSettings) -> dict:
    return {f"rollout.{name}": getattr(settings.rollout, name)
            for name in ("tool_timeout", "tool_workers", "sandbox_write_mb", "sandbox_isolation")}


# ---------------------------------------------------------------------------------- the engine

class VerlServerEngine(TokenLists):
    """:class:`~aepo_rl.engines.base.GenerationEngine` over verl's ``LLMServerClient``.

    Called from a worker thread: every ``generate`` submits one ``server.generate`` per sequence to
    the agent-loop worker's event loop and waits for all of them (one round of the tree). Request id
    = the prompt's uid for every call, so verl routes the whole tree to one replica.

    Segments: ``logprobs`` are the server's; ``entropies`` hold the surprisal −log π of each sampled
    token (verl's servers return no distribution: see ``entropy_measure=surprisal``, §1.2);
    ``finish_reason`` is recovered from the tokens (verl collapses stop/length into "completed"):
    an EOS id ends it "eos", a stop string in the decoded tail "stop", anything else "length".
    """

    def __init__(self, server, tokenizer, loop: asyncio.AbstractEventLoop, request_id: str,
                 sampling_extra: dict | None = None, eos_ids: list[int] | None = None, timeout: float | None = None):
        self.server, self.tokenizer, self.loop, self.request_id = server, tokenizer, loop, request_id
        self.vocab_size = len(tokenizer)
        self.sampling_extra = dict(sampling_extra or {})
        ids = set(eos_ids or []) | {tokenizer.eos_token_id}
        self.eos_ids = {i for i in ids if i is not None}
        self.timeout = timeout
        self._sequences: SequenceTable[list[int]] = SequenceTable("VerlServerEngine")
        self.global_steps: list = []
        """global_steps (weight version) of every server answer of this engine, when the server reports it."""
        self.counters = {"prefill_tokens": 0.0, "decode_tokens": 0.0, "requests": 0.0, "generate_seconds": 0.0}
        self._closed = threading.Event()
        self._pending: list = []

    def close(self) -> None:
        """Make every later ``generate`` fail and cancel the requests in flight (a failed or timed-out tree)."""
        self._closed.set()
        for future in list(self._pending):
            future.cancel()

    # -- generation ------------------------------------------------------------------------
    def sampling_params(self, params: SamplingParams, max_tokens: int) -> dict:
        greedy = params.greedy or params.temperature == 0
        out = {**self.sampling_extra,
               "temperature": 0.0 if greedy else params.temperature,
               "top_p": 1.0 if greedy else params.top_p,
               "top_k": params.top_k if params.top_k > 0 and not greedy else -1,
               "max_tokens": int(max_tokens), "logprobs": True, "include_stop_str_in_output": True}
        if params.stop:
            out["stop"] = list(params.stop)
        return out

    async def _one(self, context: list[int], params: SamplingParams, budget: int):
        return await self.server.generate(request_id=self.request_id, prompt_ids=list(context),
                                          sampling_params=self.sampling_params(params, budget))

    def generate(self, seq_ids: list[int], params: SamplingParams, max_new_tokens: list[int]) -> list[Segment]:
        if len(seq_ids) != len(max_new_tokens):
            raise ValueError(f"generate: {len(seq_ids)} seq_ids but {len(max_new_tokens)} max_new_tokens")
        if self._closed.is_set():
            raise RuntimeError(f"VerlServerEngine for request {self.request_id}: closed (the tree failed or timed out)")
        seqs = [self._sequences[s] for s in seq_ids]
        todo = [(i, seq) for i, (seq, budget) in enumerate(zip(seqs, max_new_tokens)) if budget > 0]

        async def round_():
            return await asyncio.gather(*(self._one(seq, params, max_new_tokens[i]) for i, seq in todo))

        t0 = time.perf_counter()
        future = asyncio.run_coroutine_threadsafe(round_(), self.loop)
        self._pending.append(future)
        try:
            outputs = future.result(self.timeout)
            self.counters["generate_seconds"] += time.perf_counter() - t0
        except BaseException:
            future.cancel()
            if self._closed.is_set():  # closed by the coordinator while this round was in flight
                raise RuntimeError(f"VerlServerEngine for request {self.request_id}: closed (the tree failed or "
                                   "timed out)") from None
            raise
        finally:
            self._pending.remove(future)
        segments = [Segment([], [], [], [], "length") for _ in seqs]
        for (i, seq), output in zip(todo, outputs):
            segment = self._segment(output, params)
            self.counters["prefill_tokens"] += len(seq)
            self.counters["decode_tokens"] += len(segment.token_ids)
            self.counters["requests"] += 1
            seq.extend(segment.token_ids)
            steps = (output.extra_fields or {}).get("global_steps")
            if steps is not None:
                self.global_steps.append(steps)
            segments[i] = segment
        return segments

    def _segment(self, output, params: SamplingParams) -> Segment:
        if output.stop_reason == "aborted":
            raise RuntimeError(f"verl's server aborted request {self.request_id} (weights update or shutdown)")
        tokens = list(output.token_ids)
        if output.log_probs is None and tokens:
            raise ValueError("verl's server returned no log-probs: set "
                             "actor_rollout_ref.rollout.calculate_log_probs=true (the tree's "
                             "surprisal entropy and the leaves' rollout log-probs need them)")
        logprobs = [float(x) for x in (output.log_probs or [])]
        if len(logprobs) != len(tokens):
            raise ValueError(f"verl's server returned {len(tokens)} tokens but {len(logprobs)} log-probs")
        reason, stop = finish_reason(tokens, self.tokenizer, self.eos_ids, params.stop)
        return Segment(tokens, logprobs, [-x for x in logprobs], [], reason, stop)


def finish_reason(tokens: list[int], tokenizer, eos_ids: set[int], stops: tuple[str, ...]) -> tuple[str, str | None]:
    """("eos", None) when the last token is an EOS id, ("stop", s) when the decoded tail ends a stop
    string s (the latest one when several occur), else ("length", None)."""
    if not tokens:
        return "length", None
    if tokens[-1] in eos_ids:
        return "eos", None
    if stops:
        window = max(len(s.encode()) for s in stops) + 1
        text = tokenizer.decode(tokens[-window:], skip_special_tokens=False).rstrip(REPLACEMENT_CHAR)
        hits = [(text.rfind(s) + len(s), s) for s in stops if s in text]
        if hits:
            return "stop", max(hits)[1]
    return "length", None


# ---------------------------------------------------------------------------------- the coordinator

@dataclass
class _Tree:
    n: int
    task: asyncio.Future
    claimed: set = field(default_factory=set)
    engine: VerlServerEngine | None = None
    timed_out: bool = False


class TreeCoordinator:
    """The trees of one agent-loop worker's event loop, keyed by ``(uid, global_steps)``, and its tools.

    The first session of a prompt starts the tree (a thread running aepo_rl's controller); every
    session awaits it (shielded: a cancelled session does not cancel the others' tree) and takes its
    own leaf. A failed tree fails all n sessions at once; a tree running past ``timeout`` is closed
    and fails them with TimeoutError; so no session waits forever. A key is dropped once its n
    sessions have collected, or at once on failure; finished trees of older steps are pruned."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_workers: int = 64):
        self._loop = weakref.ref(loop)  # weak: the loops' class keys its coordinators weakly by this loop
        self._trees: dict[tuple, _Tree] = {}
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="aepo-tree")
        self._tools: dict[str, dict] = {}
        self._tools_lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop whose sessions this coordinator serves (None once it is gone)."""
        return self._loop()

    def tools(self, settings: AEPOLoopSettings, split: str = "train") -> dict:
        """:func:`build_tools`, built once per settings and split (called from the trees' threads)."""
        key = repr((sorted(asdict(settings.task).items()), settings.tools, sorted(_tool_knobs(settings).items()),
                    split))
        with self._tools_lock:
            if key not in self._tools:
                self._tools[key] = build_tools(settings, split)
            return self._tools[key]

    def __len__(self) -> int:
        return len(self._trees)

    def _prune(self, steps) -> None:
        for key, tree in list(self._trees.items()):
            if key[1] != steps and tree.task.done():
                del self._trees[key]

    async def leaf(self, key: tuple, session_id: int, n: int, build, timeout: float):
        """Leaf ``session_id`` of the tree ``build()`` grows (``build`` returns (engine, thread function))."""
        if not 0 <= session_id < n:
            raise ValueError(f"aepo_tree: session_id {session_id} outside 0..{n - 1}: the tree has rollout.n={n} "
                             "leaves; validation sessions (val_kwargs.n) need agent_name=aepo_chain (docs/verl.md)")
        tree = self._trees.get(key)
        if tree is None:
            self._prune(key[1])
            engine, grow = build()
            loop = asyncio.get_running_loop()
            tree = _Tree(n, loop.run_in_executor(self.pool, grow), engine=engine)
            self._trees[key] = tree
        elif tree.n != n:
            raise ValueError(f"aepo_tree: sessions of prompt {key[0]} disagree on n ({tree.n} vs {n})")
        if session_id in tree.claimed:
            raise ValueError(f"aepo_tree: session {session_id} of prompt {key[0]} (step {key[1]}) asked twice")
        tree.claimed.add(session_id)
        try:
            leaves = await asyncio.wait_for(asyncio.shield(tree.task), timeout)
        except asyncio.CancelledError:
            raise  # this session was cancelled; the shielded tree goes on for the others
        except Exception as error:
            if isinstance(error, TimeoutError):
                tree.timed_out = True
            if tree.engine is not None:
                tree.engine.close()
            self._trees.pop(key, None)
            if tree.timed_out:  # every session of a timed-out tree says so, whichever error reached it
                raise TimeoutError(f"aepo_tree: the tree of prompt {key[0]} (step {key[1]}) ran past "
                                   f"{CUSTOM_KEY}.tree_timeout={timeout} s") from None
            raise
        finally:
            if len(tree.claimed) == n and self._trees.get(key) is tree:
                del self._trees[key]
        return leaves[session_id]


# ---------------------------------------------------------------------------------- the agent loops

def leaf_output(traj: Trajectory, group: list[Trajectory], global_samples: int, prompt_ids: list[int],
                seconds: float, steps: list, response_length: int, step_of_prompt=None,
                generate_seconds: float | None = None) -> AgentLoopOutput:
    """One leaf as verl's AgentLoopOutput: the engine's token ids (prefix + own tokens, tool results
    included), response mask 0 on tool results, the sampled log-probs (0 on tool results), tree
    metadata in ``extra_fields``. ``min/max_global_steps`` span the weight versions the server reported,
    else ``step_of_prompt`` (verl's V1 trainer builds an int array of them and cannot take None).
    Timing (verl's ``agent_loop/*``): the whole tree's time waiting for the server as
    ``generate_sequences``, the rest of its wall time ``seconds`` (tools, the controller) as ``tool_calls``."""
    depth, parent = 0, traj.parent_id
    while parent is not None:
        depth, parent = depth + 1, group[parent].parent_id
    extra = {
        "aepo_traj_id": traj.traj_id,
        "aepo_parent_id": -1 if traj.parent_id is None else traj.parent_id,
        "aepo_fork_token_index": -1 if traj.fork_token_index is None else traj.fork_token_index,
        "aepo_depth": depth,
        "aepo_global_samples": global_samples,
        "aepo_branches": sum(t.parent_id is not None for t in group),
        "aepo_num_tool_calls": traj.num_tool_calls,
        "aepo_tool_errors": sum(call.error for call in traj.tool_calls),
        "aepo_finish_reason": traj.finish_reason,
        "turn_scores": [], "tool_rewards": [],
    }
    steps = list(steps) or ([step_of_prompt] if step_of_prompt is not None else [])
    if steps:  # the weight versions of the whole tree's generation (staleness control of verl's async modes)
        extra["min_global_steps"], extra["max_global_steps"] = min(steps), max(steps)
    return AgentLoopOutput(
        prompt_ids=list(prompt_ids),
        response_ids=traj.response_token_ids[:response_length],
        response_mask=traj.loss_mask[:response_length],
        response_logprobs=traj.logprobs[:response_length],
        num_turns=1 + len(traj.rounds) + traj.num_tool_calls,
        metrics=AgentLoopMetrics(generate_sequences=seconds if generate_seconds is None else generate_seconds,
                                 tool_calls=0.0 if generate_seconds is None else max(0.0, seconds - generate_seconds)),
        extra_fields=extra,
    )


class _AEPOLoopBase(AgentLoopBase):
    validation = False
    coordinators: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()
    """The one thing the sessions of a worker share: its :class:`TreeCoordinator`, per running event loop
    (verl runs one per agent-loop worker; verl builds a fresh loop instance per session). Weakly keyed:
    a closed and dropped event loop takes its coordinator with it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = loop_settings(self.rollout_config)

    def coordinator(self) -> TreeCoordinator:
        """The running event loop's coordinator (made by its first session)."""
        loop = asyncio.get_running_loop()
        found = self.coordinators.get(loop)
        if found is None:
            found = self.coordinators[loop] = TreeCoordinator(loop, self.settings.max_concurrent_trees)
        return found

    async def _prompt_ids(self, kwargs: dict) -> list[int]:
        if "raw_prompt" not in kwargs:
            raise KeyError("aepo agent loops need the dataset field raw_prompt (verl's RLHFDataset gives it; "
                           "aepo verl-data writes the prompt column it comes from)")
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        return self._cap_text_prompt_length(list(prompt_ids))

    def _sampling(self, sampling_params: dict) -> tuple[SamplingParams, dict]:
        temperature = float(sampling_params.get("temperature", 1.0))
        top_k = int(sampling_params.get("top_k", -1) or -1)
        params = SamplingParams(temperature=temperature, top_p=float(sampling_params.get("top_p", 1.0)),
                                top_k=max(top_k, 0), greedy=temperature == 0)
        extra = {k: v for k, v in sampling_params.items()
                 if k not in ("temperature", "top_p", "top_k", "logprobs", "max_tokens", "stop")}
        return params, extra

    def _grow(self, engine: VerlServerEngine, prompt_ids: list[int], uid: str, params: SamplingParams,
              seed: int, step_of_prompt=None):
        from aepo_rl.rollout.tree import run_rollout

        coordinator = self.coordinator()

        def grow():
            t0 = time.perf_counter()
            try:
                tools = coordinator.tools(self.settings, "dev" if self.validation else "train")
                result = run_rollout(engine, [(uid, prompt_ids)], tools, self.settings.rollout,
                                     validation=self.validation, sampling=params, seed=seed)
            except BaseException:
                engine.close()
                raise
            seconds = time.perf_counter() - t0
            group, m = result.groups[0], result.global_samples[0] if result.global_samples else 1
            return [leaf_output(t, group, m, prompt_ids, seconds, engine.global_steps,
                                self.settings.rollout.max_response_length, step_of_prompt,
                                engine.counters["generate_seconds"]) for t in group]

        return grow

    def _engine(self, uid: str, extra: dict) -> VerlServerEngine:
        return VerlServerEngine(self.server_manager, self.tokenizer, asyncio.get_running_loop(), str(uid), extra,
                                timeout=self.settings.tree_timeout)


def _seed(uid: str, steps) -> int:
    return zlib.crc32(f"{uid}/{steps}".encode())


def _warn_if_validation(rollout_config, sampling_params: dict) -> None:
    """Warn (Python's default filter: once per process) when aepo_tree gets verl's validation sampling
    (val_kwargs.temperature, not the training temperature): a validation row without agent_name went to
    aepo_tree through default_agent_loop, which grows a whole tree per session and keeps leaf 0 (review L5)."""
    val = (rollout_config.get("val_kwargs", None) or {}).get("temperature", None)
    train = rollout_config.get("temperature", None)
    got = sampling_params.get("temperature", None)
    if val is None or got is None or float(val) == float(train) or float(got) != float(val):
        return
    warnings.warn(f"aepo_tree got validation sampling (temperature={got} = rollout.val_kwargs.temperature): a "
                  "validation row without agent_name went to aepo_tree through rollout.agent.default_agent_loop; it "
                  "grows a whole tree per session and keeps leaf 0. Give validation rows agent_name=aepo_chain "
                  "(aepo verl-data does)", UserWarning, stacklevel=2)


class AEPOTreeAgentLoop(_AEPOLoopBase):
    """n sessions of a prompt = the n leaves of one AEPO tree (§1), through the worker's TreeCoordinator."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        for key in ("uid", "session_id"):
            if key not in kwargs:
                raise KeyError(f"aepo_tree needs verl's V1 agent-loop worker, which passes '{key}' to every session "
                               "(the legacy path repeats rows and may split a prompt's sessions across workers)")
        uid, session_id, steps = str(kwargs["uid"]), int(kwargs["session_id"]), kwargs.get("global_steps", -1)
        n = self.settings.rollout.n
        _warn_if_validation(self.rollout_config, sampling_params)
        prompt_ids = await self._prompt_ids(kwargs)
        params, extra = self._sampling(sampling_params)

        def build():
            engine = self._engine(uid, extra)
            return engine, self._grow(engine, prompt_ids, uid, params, _seed(uid, steps), kwargs.get("global_steps"))

        return await self.coordinator().leaf(
            (uid, steps), session_id, n, build, self.settings.tree_timeout)


class AEPOChainAgentLoop(_AEPOLoopBase):
    """One independent multi-turn trajectory per session (no tree): validation, greedy when verl's
    val_kwargs.temperature is 0."""

    validation = True

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        uid = str(kwargs.get("uid", "prompt"))
        session = kwargs.get("session_id", 0)
        prompt_ids = await self._prompt_ids(kwargs)
        params, extra = self._sampling(sampling_params)
        engine = self._engine(f"{uid}/{session}", extra)
        grow = self._grow(engine, prompt_ids, uid, params, _seed(uid, session), kwargs.get("global_steps"))
        pool = self.coordinator().pool  # not the loop's default executor (verl's)
        leaves = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(pool, grow),
                                        self.settings.tree_timeout)
        return leaves[0]
