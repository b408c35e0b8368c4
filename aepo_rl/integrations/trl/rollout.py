"""``TreeRolloutFunc``: a TRL ``rollout_func`` that grows aepo_rl's tree rollout (docs/algorithm.md §1).

TRL 1.16 calls ``rollout_func(prompts, trainer)`` with this process's slice of the generation
batch, each prompt repeated ``num_generations`` times in consecutive rows. Each block of identical
rows becomes one tree of n = ``num_generations`` trajectories (§1.3–§1.5: global samples, forks at
tool calls, restarts) grown by :func:`aepo_rl.rollout.tree.run_rollout` over an
:class:`~aepo_rl.engines.hf.HFEngine` on the trainer's own model; trajectory i of the tree fills
row i of the block. Token-in, token-out (§1.1): ``prompt_ids`` / ``completion_ids`` are the
engine's token ids, ``logprobs`` its log-probs (0 on tool tokens; ``logprobs_mode`` says of which distribution:
TRL's own are of the tempered one), and ``env_mask`` the loss mask
(0 on tool-result tokens), which TRL multiplies into its completion mask. Tree metadata goes to
the reward functions as keyword columns (``aepo_parent_id``, ``aepo_fork_token_index``,
``aepo_finish_reason``, ``aepo_num_tool_calls``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from aepo_rl.config import RolloutConfig, surprisal_logprobs_error
from aepo_rl.engines import cpu_decode_threads
from aepo_rl.engines.hf import HFEngine
from aepo_rl.protocol import Protocol
from aepo_rl.rollout.tree import RolloutState, run_rollout
from aepo_rl.tools.base import Tool

_SET_FROM_TRAINER = ("n", "temperature", "top_p", "top_k", "max_response_length", "seed")
"""RolloutConfig keys the trainer's GRPOConfig decides (num_generations, sampling, max_completion_length, seed)."""


class TreeRolloutFunc:
    """``rollout_func=TreeRolloutFunc(tools, mode="aepo", ...)`` for ``GRPOTrainer`` / ``AEPOGRPOTrainer``.

    ``tools``: aepo_rl tools (``aepo_rl.tools.get_tool("search", ...)``, or any object with
    ``name``, ``tag``, ``description`` and ``run(arg) -> str``), a list or a dict keyed by tag.
    ``rollout``: a :class:`~aepo_rl.config.RolloutConfig`, and/or its keys as keyword arguments
    (mode, global_samples, entropy_weight, call_limit, max_tokens_per_round, tool_format, ...;
    docs/configuration.md). n, temperature, top_p, top_k, the response budget and the seed come
    from the trainer's config (num_generations, temperature, top_p, top_k, max_completion_length,
    seed + global step). In evaluation the trees become ``num_generations_eval`` independent
    samples per prompt (§1: no branching outside training).
    """

    def __init__(self, tools: Sequence[Tool] | Mapping[str, Tool], rollout: RolloutConfig | None = None, **overrides):
        self.tools = dict(tools) if isinstance(tools, Mapping) else {tool.tag: tool for tool in tools}
        decided = sorted(set(overrides) & set(_SET_FROM_TRAINER))
        if decided:
            raise ValueError(f"TreeRolloutFunc: {decided} come from the trainer's GRPOConfig (num_generations, "
                             "temperature, top_p, top_k, max_completion_length, seed); set them there")
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(RolloutConfig)})
        if unknown:
            raise ValueError(f"TreeRolloutFunc: unknown rollout keys {unknown} (the keys "
                             "of aepo_rl.config.RolloutConfig, docs/configuration.md)")
        self.rollout = dataclasses.replace(rollout or RolloutConfig(), **overrides)
        if self.rollout.engine != "hf":
            raise ValueError(f"TreeRolloutFunc: rollout.engine={self.rollout.engine!r} is not supported; it generates "
                             "with the trainer's own model (engine 'hf')")
        if (error := surprisal_logprobs_error(self.rollout)) is not None:
            raise ValueError(f"TreeRolloutFunc: {error}")
        self.state = RolloutState()
        """Carried across calls (the release's slot-keyed ΔH baselines, §1.4)."""
        self.last_result = None
        """The latest :class:`~aepo_rl.rollout.tree.RolloutResult` (trees, rollout metrics)."""

    def system_prompt(self) -> str:
        """The system message that teaches the model this rollout's tool protocol (§1.1), the one aepo-rl's tasks
        give every prompt: put it first in each prompt, or a model trained on the protocol calls no tool."""
        return Protocol(self.tools, self.rollout.tool_format).system_prompt()

    def _check(self, trainer) -> None:
        args = trainer.args
        if trainer.use_vllm:
            raise ValueError("TreeRolloutFunc generates with the trainer's own model (aepo_rl's HF engine); "
                             "use_vllm=True is not supported (TRL 1.16 pins vllm<=0.31, aepo_rl's VLLMEngine is "
                             "verified on 0.32-0.34): set use_vllm=False (docs/trl.md)")
        if args.min_p is not None or args.repetition_penalty != 1.0 or args.generation_kwargs:
            raise ValueError("TreeRolloutFunc samples with temperature, top_p and top_k only; unset min_p, "
                             "repetition_penalty (1.0) and generation_kwargs in the GRPOConfig")
        if args.mask_truncated_completions:
            raise ValueError("TreeRolloutFunc: mask_truncated_completions=True would drop every trajectory that does "
                             "not end with EOS, those ending at </answer> or a call limit included; set it to False")
        if (args.off_policy_mask_threshold is not None and args.temperature != 1.0
                and self.rollout.logprobs_mode == "raw_logprobs"):
            raise ValueError("TreeRolloutFunc: off_policy_mask_threshold compares the rollout's log-probs with TRL's "
                             f"own, which are of the tempered policy (logits / temperature={args.temperature}), but "
                             "this rollout records the untempered policy's (logprobs_mode='raw_logprobs'): pass "
                             "TreeRolloutFunc(..., logprobs_mode='processed_logprobs')")
        if trainer.tools or trainer.environment_factories is not None:
            raise ValueError("TreeRolloutFunc runs the tools itself: pass them to TreeRolloutFunc(tools), not "
                             "tools= / environment_factory= to the trainer")

    def _prompt_ids(self, trainer, prompts: list) -> list[list[int]]:
        """Token ids of each prompt exactly as GRPOTrainer tokenizes it (chat template for messages)."""
        prompt_ids, images, _ = trainer._tokenize_prompts(prompts)
        if images is not None:
            raise ValueError("TreeRolloutFunc: prompts with images are not supported")
        return [list(ids) for ids in prompt_ids]

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        self._check(trainer)
        training = trainer.model.training
        n = trainer.num_generations if training else trainer.num_generations_eval
        if len(prompts) % n:
            raise ValueError(f"TreeRolloutFunc got {len(prompts)} prompts, not whole groups of num_generations={n}: "
                             "make per_device_train_batch_size (and per_device_eval_batch_size) a multiple of "
                             "num_generations, so no prompt's group spans two processes")
        blocks = [prompts[i:i + n] for i in range(0, len(prompts), n)]
        for b, block in enumerate(blocks):
            if any(p != block[0] for p in block):
                raise ValueError(f"TreeRolloutFunc: rows {b * n}..{b * n + n - 1} are not one prompt repeated "
                                 f"num_generations={n} times, the layout TRL 1.16's sampler gives")
        ids = self._prompt_ids(trainer, [block[0] for block in blocks])
        args, process = trainer.args, trainer.accelerator.process_index
        # U draws and sampler (§1.4), per step and rank
        seed = args.seed + trainer.state.global_step + 100_003 * process
        cfg = dataclasses.replace(
            self.rollout, n=n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k or 0,
            max_response_length=args.max_completion_length, seed=seed,
            mode=self.rollout.mode if training else "independent",
            max_prompt_length=max(self.rollout.max_prompt_length, *map(len, ids)))
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gather_deepspeed3_params=args.ds3_gather_for_generation,
                                         gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model:
            engine = HFEngine(model, trainer._tokenizer, seed=cfg.seed, cpu_threads=cpu_decode_threads(cfg, model),
                              cuda_graphs=cfg.cuda_graphs, logprobs_mode=cfg.logprobs_mode)
            result = run_rollout(engine, [(f"p{process}-{b}", prompt) for b, prompt in enumerate(ids)], self.tools,
                                 cfg, state=self.state)
        self.last_result = result
        for name, value in result.metrics.items():
            trainer._metrics["train" if training else "eval"][f"aepo/{name}"].append(value)
        rows = [traj for group in result.groups for traj in group]
        return {
            "prompt_ids": [t.prompt_token_ids for t in rows],
            "completion_ids": [t.response_token_ids for t in rows],
            "logprobs": [t.logprobs for t in rows],
            "env_mask": [t.loss_mask for t in rows],
            "aepo_parent_id": [t.parent_id for t in rows],
            "aepo_fork_token_index": [t.fork_token_index for t in rows],
            "aepo_finish_reason": [t.finish_reason for t in rows],
            "aepo_num_tool_calls": [t.num_tool_calls for t in rows],
        }
