"""One registry per extension point, and the plugins that add to them.

Seven kinds of entry can be added without touching the package, each with its decorator:

- ``register_policy_loss`` → ``POLICY_LOSSES``: ``fn(old_log_prob, log_prob, advantages,
  response_mask, loss_agg_mode, config, entropy, *, entropy_stats, index) -> (loss, metrics)``;
- ``register_advantage_estimator`` → ``ADVANTAGE_ESTIMATORS``: ``fn(token_level_rewards,
  response_mask, index, config, **needs) -> (advantages, returns)``;
- ``register_tool`` → ``TOOLS``: a factory ``(**options) -> Tool``;
- ``register_reward`` → ``REWARDS``: ``fn(response, answers, question="") -> float``;
- ``register_task`` → ``TASKS``: a factory ``(cfg: Config) -> Task``;
- ``register_engine`` → ``ENGINES``: a factory ``(cfg, model, tokenizer) -> GenerationEngine``;
- ``register_architecture`` → ``ARCHITECTURES``: a factory ``(vocab_size) -> transformers config``.

An entry declares what it needs or provides as capabilities, and the trainer asks for those
rather than for names: ``@register_policy_loss("aepo", needs=("entropy", "entropy_stats"))``,
``@register_reward("math", binary=True)``, ``@register_engine("hf", shares_weights=True)``. Each
registry states the capabilities it knows (``Registry.defaults``, ``Registry.vocabulary``); an
unknown one is an error at registration. Config fields that name an entry (``algorithm.policy_loss``,
``task.reward``, ``rollout.engine``, ...) accept exactly the registered names.

The built-in entries of a registry are registered by importing its ``builtins`` module, which
happens on the first read. This module imports only the standard library (and ``aepo_rl.errors``,
which does too), so a plugin can import it cheaply.

Plugins: ``aepo --plugin my_pkg.my_loss --plugin ./my_task.py train ...`` imports those modules
(and every module of the ``aepo_rl.plugins`` entry-point group) before the config is validated;
:func:`load_plugins` does the same from Python.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aepo_rl.errors import UserError

ENTRY_POINT_GROUP = "aepo_rl.plugins"


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered; the message lists the registered names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PluginError(UserError, ImportError):
    """A plugin module could not be imported; the message names the plugin and where it failed."""


class Registry(Mapping[str, Any]):
    """Name → entry of one extension point; each entry carries the capabilities it declared.

    A name ``family:<arg>`` (e.g. ``reasoning_gym:<generator>``) is a pattern: it matches every
    name ``family:...``. Iteration is in sorted order.
    """

    def __init__(self, kind: str, builtins: str, *, builtin_names: tuple[str, ...] | None = None,
                 vocabulary: tuple[str, ...] = (), **defaults: Any):
        self.kind = kind
        """What an entry is, for messages ("policy loss")."""
        self.builtins = builtins
        """Module whose import registers the built-in entries."""
        self.builtin_names = builtin_names
        """The names ``builtins`` registers, when declared: membership and iteration then do not import
        it (it imports torch), so validating a config stays fast; lookups do."""
        self.vocabulary = vocabulary
        """The values ``needs`` may hold: inputs the caller knows how to provide."""
        self.defaults = {"needs": (), **defaults}
        """Every capability an entry may declare, with the value of an entry that declares nothing."""
        self._entries: dict[str, Any] = {}
        self._capabilities: dict[str, Mapping[str, Any]] = {}
        self._loaded = False

    # -- registration ---------------------------------------------------------------------------

    def register(self, *names: str, **capabilities: Any) -> Callable[[Any], Any]:
        """Decorator registering an entry under one or more names (an existing name is replaced)."""
        if not names:
            raise TypeError(f"register a {self.kind} under at least one name")
        unknown = sorted(set(capabilities) - set(self.defaults))
        if unknown:
            raise TypeError(f"{self.kind} {names[0]!r}: unknown capability {unknown}; "
                            f"a {self.kind} declares {sorted(self.defaults)}")
        needs = tuple(capabilities.get("needs", ()))
        if isinstance(capabilities.get("needs"), str) or not set(needs) <= set(self.vocabulary):
            raise TypeError(f"{self.kind} {names[0]!r}: needs={capabilities['needs']!r}; a {self.kind} may need "
                            f"a tuple of {list(self.vocabulary)}")
        declared = types.MappingProxyType({**self.defaults, **capabilities, "needs": needs})

        def wrap(entry: Any) -> Any:
            for name in names:
                self._entries[name] = entry
                self._capabilities[name] = declared
            return entry

        return wrap

    def __delitem__(self, name: str) -> None:
        self._load()
        del self._entries[name], self._capabilities[name]

    # -- lookup ---------------------------------------------------------------------------------

    def lookup(self, name: str) -> Any:
        """The entry registered as ``name`` (UnknownNameError listing the valid names otherwise)."""
        return self._entries[self._key(name)]

    def capabilities(self, name: str) -> Mapping[str, Any]:
        """What the entry ``name`` declared, every capability of ``defaults`` filled in."""
        return self._capabilities[self._key(name)]

    def needs(self, name: str, what: str) -> bool:
        """Whether the entry ``name`` declared ``what`` in its ``needs``."""
        return what in self.capabilities(name)["needs"]

    def _key(self, name: str) -> str:
        self._load()
        return self._match(name)

    def _match(self, name: str) -> str:
        """The registered name or pattern ``name`` matches; the built-ins count as registered."""
        names = self._names()
        if name in names:
            return name
        family = name.split(":", 1)[0] + ":<"
        if ":" in name:
            for key in names:
                if key.startswith(family) and key.endswith(">"):
                    return key
        raise UnknownNameError(f"unknown {self.kind} '{name}'; valid names: {', '.join(sorted(names))}")

    def _names(self) -> set[str]:
        """Every name: the registered ones, and the declared built-ins while ``builtins`` is not imported."""
        if self._loaded or self.builtin_names is None:
            self._load()
            return set(self._entries)
        return set(self.builtin_names) | set(self._entries)

    def _load(self) -> None:
        if not self._loaded:
            importlib.import_module(self.builtins)
            self._loaded = True

    # -- Mapping --------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        try:
            return self.lookup(name)
        except UnknownNameError as err:
            raise KeyError(name) from err

    def __contains__(self, name: object) -> bool:
        try:
            self._match(name)  # type: ignore[arg-type]
        except UnknownNameError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names()))

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self)})"


POLICY_LOSSES = Registry("policy loss", "aepo_rl.algorithms.losses", vocabulary=("entropy", "entropy_stats"),
                         builtin_names=("aepo", "cispo", "dapo", "gppo", "grpo", "gspo", "ppo"), token_flags=False)
"""needs: ``entropy`` = the current policy's token entropies H (``entropy=``; None otherwise);
``entropy_stats`` = (mean, std) of H_old over the ``algorithm.entropy_adv_scope`` (§2.2), passed as
``entropy_stats=`` when ``algorithm.entropy_adv_coef`` > 0. token_flags: the loss accepts
``token_flags={}`` and fills it with per-token bool indicators under its metric names (the trainer
then logs their shares over the mini-batch's high-entropy tokens, §7.1)."""

ADVANTAGE_ESTIMATORS = Registry("advantage estimator", "aepo_rl.algorithms.advantages",
                                vocabulary=("anchor_keys", "kl"),
                                builtin_names=("dr_grpo", "gigpo", "grpo", "reinforce_plus_plus",
                                               "reinforce_plus_plus_baseline", "rloo"))
"""needs: ``anchor_keys`` = [B, R] GiGPO state of each token (§4); ``kl`` = the per-token KL to the
reference with ``algorithm.use_kl_in_reward``, which the estimator applies itself (for the others
the trainer subtracts ``kl_coef``·KL from the token rewards)."""

TOOLS = Registry("tool", "aepo_rl.tools")
"""Factories ``(**options) -> Tool``; no capabilities."""

REWARDS = Registry("reward", "aepo_rl.rewards", vocabulary=("judge",), binary=False, extra=None)
"""binary: the reward is 1 exactly when the answer is right, so ``correct`` (pass@k) reads it;
needs ``judge``: the entry is a factory ``(judge_url, judge_model, **options) -> reward``; extra: ``(module,
extra)`` when the reward imports an optional package (``get_reward`` refuses it, naming the extra, when missing)."""

TASKS = Registry("task", "aepo_rl.tasks")
"""Factories ``(cfg: Config) -> Task``; no capabilities."""

CORPORA = Registry("corpus", "aepo_rl.tasks", builtin_names=("synthetic",))
"""Named search corpora, factories ``(seed: int) -> list of {"id", "title", "text"} documents``: a task hands
its documents to the search tool this way (``corpus="synthetic"``, ``aepo serve-search --corpus synthetic``),
so tools never import tasks; no capabilities."""

ENGINES = Registry("engine", "aepo_rl.engines", shares_weights=False, syncs_weights=False, entropies=(), sampling=(),
                   behaviour_logprobs=False, processed_logprobs=False)
"""shares_weights: the engine generates with the trainer's own model object, so it samples the
current policy with no weight sync and its recorded log-probs and entropies are the policy's;
syncs_weights: the engine holds its own copy of the weights and has ``sync_weights(model)``, which
the built-in trainer calls after every optimizer step, before the next rollout (π_old then comes
from the trainer's own forward). The built-in trainer needs one of the two. entropies: the
step-entropy measures (``rollout.entropy_measure``, §1.2) it can give exactly: ``full`` (full-vocabulary
entropies), ``surprisal`` (the sampled tokens' untempered log-probs) and/or ``top10_proxy`` (the release's).
sampling: the optional sampling options of
:class:`~aepo_rl.engines.base.SamplingParams` it honours (``min_tokens``, ``ignore_eos``,
``repetition_penalty``, ``min_p``); a run that sets another one (``rollout.<option>``) is refused at start.
behaviour_logprobs: every generated token's recorded ``logprobs`` entry is the log-prob of the engine's own
weights (untempered, or as ``rollout.logprobs_mode`` asks), finite, so Rollout Correction
(``algorithm.rollout_correction``, §2.11) can use it as π_rollout; a run that turns the correction on with an
engine that does not declare it is refused at start.
processed_logprobs: the factory honours ``rollout.logprobs_mode=processed_logprobs`` (vLLM's name): each recorded
``logprobs`` entry is then the log-prob under the distribution the token was drawn from (after the repetition
penalty, temperature, min-p, top-k and top-p, renormalised); a run that sets it with an engine that does not
declare it is refused at start."""

ARCHITECTURES = Registry("architecture", "aepo_rl.architectures",
                         builtin_names=("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"))
"""Factories ``(vocab_size) -> transformers config`` of real model shapes, built with random weights by
``model.init=random:<name>``; no capabilities."""

register_policy_loss = POLICY_LOSSES.register
register_advantage_estimator = ADVANTAGE_ESTIMATORS.register
register_tool = TOOLS.register
register_reward = REWARDS.register
register_task = TASKS.register
register_corpus = CORPORA.register
register_engine = ENGINES.register
register_architecture = ARCHITECTURES.register


# ----------------------------------------------------------------------------------------------
# Plugins


def load_plugin(spec: str) -> types.ModuleType:
    """Import one plugin: a module name (``my_pkg.my_loss``) or the path of a ``.py`` file.

    Importing it runs its ``@register_...`` decorators. PluginError names the plugin, the error
    and the line it came from when the import fails.
    """
    try:
        if spec.endswith(".py"):
            path = Path(spec).expanduser().resolve()
            if not path.is_file():
                raise FileNotFoundError(f"no such file {path}")
            name = f"aepo_rl_plugin_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module  # dataclasses and pickling look the module up by name
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            return module
        return importlib.import_module(spec)
    except Exception as err:
        frames = traceback.extract_tb(err.__traceback__)
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        hint = "" if spec.endswith(".py") or not isinstance(err, ModuleNotFoundError) else \
            " (a module must be importable: installed, or on PYTHONPATH; or pass the path of its .py file)"
        raise PluginError(f"plugin '{spec}' failed to import: {type(err).__name__}: {err}{where}{hint}") from err


def load_plugins(specs: list[str] | tuple[str, ...] = (), *, entry_points: bool = True) -> list[types.ModuleType]:
    """Import every module of the ``aepo_rl.plugins`` entry-point group (when ``entry_points``), then ``specs``."""
    modules = []
    if entry_points:
        for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            modules.append(load_plugin(point.value.split(":", 1)[0]))
    return modules + [load_plugin(spec) for spec in specs]
