"""Generation engines behind one protocol (:mod:`aepo_rl.engines.base`), registered by name with
``@register_engine(name, shares_weights=..., entropies=..., sampling=...)`` on a factory
``(cfg, model, tokenizer) -> engine``."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

from aepo_rl.config import ConfigError, vllm_compilation_config
from aepo_rl.engines.base import GenerationEngine, SamplingParams, Segment
from aepo_rl.registry import ENGINES, register_engine

# Each factory imports its engine where it builds one: config validation reads the registry's names and
# capabilities (this module) and must not load torch, transformers or vLLM.

__all__ = ["GenerationEngine", "SamplingParams", "Segment", "build_engine", "check_entropy_measure",
           "check_logprobs_mode", "check_sampling_options", "register_engine"]

SAMPLING_OPTIONS = {"min_tokens": 0, "ignore_eos": False, "repetition_penalty": 1.0, "min_p": 0.0}
"""The optional sampling options (``rollout.<name>``) with their "off" values; an engine declares those it
honours with the capability ``sampling``."""


def build_engine(cfg, model, tokenizer) -> GenerationEngine:
    """The engine registered as ``cfg.rollout.engine`` (:data:`aepo_rl.registry.ENGINES`): hf (shares
    ``model``), openai (a server), vllm (in-process vLLM with weight sync) or one of yours."""
    check_sampling_options(cfg)
    check_logprobs_mode(cfg)
    return ENGINES.lookup(cfg.rollout.engine)(cfg, model, tokenizer)


def check_sampling_options(cfg) -> None:
    """Refuse, before any work, a ``rollout.<option>`` of :data:`SAMPLING_OPTIONS` set on an engine that did
    not declare it in its ``sampling`` capability (it would sample without it, silently)."""
    honoured = ENGINES.capabilities(cfg.rollout.engine)["sampling"]
    unsupported = [name for name, off in SAMPLING_OPTIONS.items()
                   if getattr(cfg.rollout, name) != off and name not in honoured]
    if unsupported:
        raise ConfigError(f"rollout.engine={cfg.rollout.engine!r} does not honour "
                          f"{', '.join(f'rollout.{name}' for name in unsupported)} (it declares sampling="
                          f"{list(honoured)}); leave {'it' if len(unsupported) == 1 else 'them'} at the default, "
                          "or use an engine that does (hf, vllm, openai)")


def check_logprobs_mode(cfg) -> None:
    """Refuse, before any work, ``rollout.logprobs_mode=processed_logprobs`` with an engine that did not declare
    the capability ``processed_logprobs`` (it would record the untempered log-probs, silently)."""
    from aepo_rl.config import ConfigError

    mode, engine = cfg.rollout.logprobs_mode, cfg.rollout.engine
    if mode != "raw_logprobs" and not ENGINES.capabilities(engine)["processed_logprobs"]:
        usable = [name for name in ENGINES if ENGINES.capabilities(name)["processed_logprobs"]]
        raise ConfigError(f"rollout.logprobs_mode={mode!r}: rollout.engine={engine!r} cannot record the log-probs of "
                          f"the distribution it samples from (registry capability processed_logprobs; the vllm engine "
                          f"is not wired to vLLM's own logprobs_mode, which would also change the top-k log-probs its "
                          f"step-entropy proxy reads): use one of {usable}, or rollout.logprobs_mode=raw_logprobs")


def check_entropy_measure(cfg) -> None:
    """Refuse, before any work, a tree rollout whose engine cannot give ``rollout.entropy_measure``
    (§1.2): the branching and pre-monitoring decisions would read another quantity. Independent
    rollouts (``rollout.mode=independent``, evaluation) make no entropy decision and pass."""
    rollout = cfg.rollout
    supported = ENGINES.capabilities(rollout.engine)["entropies"]
    if rollout.mode != "independent" and rollout.entropy_measure not in supported:
        raise ConfigError(f"rollout.entropy_measure={rollout.entropy_measure!r} cannot be computed by "
                          f"rollout.engine={rollout.engine!r}; it gives {list(supported) or 'none'} "
                          f"(set rollout.entropy_measure to one of them, or rollout.mode=independent)")


ALL_SAMPLING = tuple(SAMPLING_OPTIONS)


@register_engine("hf", shares_weights=True, entropies=("full", "surprisal", "top10_proxy"), sampling=ALL_SAMPLING,
                 behaviour_logprobs=True, processed_logprobs=True)
def hf_engine(cfg, model, tokenizer) -> GenerationEngine:
    """The built-in KV-cache decoder over the trainer's own ``model``."""
    from aepo_rl.engines.hf import HFEngine

    return HFEngine(model, tokenizer, seed=cfg.rollout.seed, cpu_threads=cpu_decode_threads(cfg.rollout, model),
                    cuda_graphs=cfg.rollout.cuda_graphs, logprobs_mode=cfg.rollout.logprobs_mode)


SMALL_POLICY = 50_000_000
"""Parameters under which ``rollout.cpu_decode_threads=None`` decodes with one thread on the CPU."""


def cpu_decode_threads(rollout_cfg, model) -> int | None:
    """``rollout.cpu_decode_threads`` for ``model``, resolved: None (the default) is one thread for a
    policy of fewer than :data:`SMALL_POLICY` parameters and torch's setting (None) for a larger one."""
    if rollout_cfg.cpu_decode_threads is not None:
        return rollout_cfg.cpu_decode_threads
    return 1 if sum(p.numel() for p in model.parameters()) < SMALL_POLICY else None


@register_engine("openai", entropies=("surprisal", "top10_proxy"), sampling=ALL_SAMPLING)
def openai_engine(cfg, model, tokenizer) -> GenerationEngine:
    """An OpenAI-compatible server at ``rollout.engine_url`` serving ``rollout.engine_model`` (or
    ``model.path``); its ``entropies`` are a top-k proxy, not the full entropy."""
    from aepo_rl.engines.openai import OpenAIEngine

    rollout = cfg.rollout
    if not rollout.engine_url:
        raise ValueError("rollout.engine=openai needs rollout.engine_url (e.g. http://127.0.0.1:8000/v1)")
    served = rollout.engine_model or cfg.model.path
    if not served:
        raise ValueError("rollout.engine=openai needs rollout.engine_model (or model.path): the served model name")
    return OpenAIEngine(rollout.engine_url, served, tokenizer, api_key=os.environ.get("OPENAI_API_KEY"),
                        seed=rollout.seed)


@register_engine("vllm", syncs_weights=True, entropies=("surprisal", "top10_proxy"), sampling=ALL_SAMPLING,
                 behaviour_logprobs=True)
def vllm_engine(cfg, model, tokenizer) -> GenerationEngine:
    """In-process vLLM (``pip install -e ".[vllm]"``) over a copy of ``model`` saved to a temporary folder;
    the RL trainer pushes its weights after every optimizer step (``sync_weights``). Its ``entropies``
    are a top-20 proxy, not the full entropy."""
    from aepo_rl.engines.stops import eos_token_ids
    from aepo_rl.engines.vllm import VLLMEngine, import_vllm
    from aepo_rl.models import save_policy

    import_vllm()  # the missing extra is named before anything is written
    rollout = cfg.rollout
    folder = tempfile.mkdtemp(prefix="aepo-vllm-")
    try:
        model_dir = save_policy(model, tokenizer, f"{folder}/model")
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        engine = VLLMEngine(str(model_dir), tokenizer, gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
                            max_model_len=rollout.vllm_max_model_len, dtype=dtype, sleep=rollout.vllm_sleep,
                            enforce_eager=rollout.vllm_enforce_eager, seed=rollout.seed,
                            compilation_config=vllm_compilation_config(rollout),
                            eos_ids=eos_token_ids(tokenizer, model))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(engine, shutil.rmtree, folder, True)
    return engine
