"""Typed configuration: the single source of truth for every knob.

Each section is a dataclass; every field carries its documentation (paper default and the
section of ``docs/algorithm.md`` it comes from, "§x.y") and its allowed range
in the field's metadata, via :func:`knob`. A ``Config`` is built from a preset, then a YAML
file, then dotted command-line overrides (``algorithm.clip_ratio_high=0.28 rollout.n=8``).
Unknown keys and out-of-range values fail with a message naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from aepo_rl import registry
from aepo_rl.errors import UserError

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
"""The values ``trainer.device`` accepts (``aepo_rl.models.resolve_device`` turns them into a torch device)."""
DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?")


class ConfigError(UserError, ValueError):
    """A configuration key or value is invalid; the message names the key and the fix."""


def _registered(name: str) -> registry.Registry:
    """The registry ``aepo_rl.registry.<name>``, read when a config is validated, so an entry the
    user registered (in a plugin, say) is accepted and the error for a wrong name lists them all."""
    return getattr(registry, name)


def knob(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
         le: float | None = None, choices: tuple | Callable[[], tuple | registry.Registry] | None = None,
         factory: Any = None) -> Any:
    """A config field with its documentation and allowed values (checked by ``validate``)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    path: str | None = knob(None, "Hugging Face model directory; None builds the tiny default model (§5).")
    init: str | None = knob(None, "random:<name>: random weights of a registered real architecture "
                                  "(aepo_rl.registry.ARCHITECTURES), the vocabulary sized to the tokenizer of "
                                  "model.path (the task's tiny tokenizer when unset), to measure speed and "
                                  "memory without weights (docs/gpu.md); None: the weights of model.path.",
                            choices=lambda: tuple(f"random:{name}" for name in _registered("ARCHITECTURES")))
    dtype: str = knob("float32", "Parameter / compute dtype of the policy.", choices=("float32", "bfloat16"))
    gradient_checkpointing: bool = knob(False, "Recompute each decoder layer's activations in the backward pass "
                                               "instead of keeping them (transformers' non-reentrant gradient "
                                               "checkpointing): less memory for more compute; training forwards "
                                               "then run every row whole, without the shared prefix (docs/gpu.md).")
    tiny_hidden_size: int = knob(128, "Tiny model: hidden size.", ge=8)
    tiny_num_layers: int = knob(2, "Tiny model: transformer layers (2 here, see lab/notebook.md).", ge=1)
    tiny_intermediate_size: int = knob(512, "Tiny model: MLP width.", ge=8)
    tiny_num_heads: int = knob(4, "Tiny model: attention heads.", ge=1)
    tiny_num_kv_heads: int = knob(4, "Tiny model: key/value heads (GQA).", ge=1)
    tiny_head_dim: int = knob(64, "Tiny model: head dimension.", ge=4)
    tiny_vocab_size: int = knob(2048, "Tiny model: BPE vocabulary size trained on the task's text.", ge=300)
    tiny_max_positions: int = knob(2048, "Tiny model: maximum sequence length.", ge=64)
    tiny_init: str = knob("induction", "Tiny model: how its weights start. induction: random, with a two-layer "
                                       "induction circuit (copying from the context) written into them; the copy "
                                       "warm-up then runs a fixed 300 steps to calibrate the rest. random: random, "
                                       "and the copy warm-up waits for the circuit to form (docs/models.md).",
                          choices=("induction", "random"))
    tiny_copy_steps: int = knob(4000, "Tiny model: most steps of the copy warm-up on repeated random "
                                      "token sequences, which stops once the model copies 90% of the "
                                      "repeated tokens; part of the cached build (stands in for "
                                      "pretraining; 0 skips it; 4000 here, see lab/notebook.md).", ge=0)
    lora_rank: int = knob(0, "LoRA rank through peft; 0 trains all weights.", ge=0)
    lora_alpha: float = knob(16.0, "LoRA alpha.", gt=0)
    lora_target_modules: list[str] = knob(None, "Modules LoRA adapts.",
                                          factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    cache_dir: str = knob("~/.cache/aepo_rl", "Where the tiny model, tokenizer and search indexes are cached.")


@dataclass
class TaskConfig:
    name: str = knob("synthetic", "Task: 'synthetic' (built-in, tools necessary), 'phantomwiki' "
                                  "(PhantomWiki universes), 'reasoning_gym:<gen>', 'file' "
                                  "(train_files/val_files), or an eval set name.",
                     choices=lambda: _registered("TASKS"))
    seed: int = knob(0, "Seed of the synthetic world and its questions.")
    num_train: int = knob(512, "Synthetic: training questions.", ge=1)
    num_dev: int = knob(64, "Synthetic: dev questions.", ge=1)
    num_test: int = knob(256, "Synthetic: held-out test questions (256: one standard "
                              "error of pass@1 is then at most 0.03).", ge=1)
    min_hops: int = knob(1, "Synthetic: fewest searches a question needs; each question's "
                            "hop level is drawn uniformly from the levels min_hops..max_hops "
                            "its kind has (arithmetic questions need 1-2).", ge=1, le=3)
    max_hops: int = knob(1, "Synthetic: most searches a question needs (1-3; 1 here, within "
                            "reach of the tiny model, see lab/notebook.md).", ge=1, le=3)
    arithmetic_fraction: float = knob(0.3, "Synthetic: share of questions needing a python computation.", ge=0, le=1)
    teacher_error_rate: float = knob(0.5, "Synthetic and phantomwiki: share of teacher demonstrations "
                                          "with a deliberate error, so cold-start SFT leaves headroom "
                                          "for RL (§5; 0.5 here, see lab/notebook.md).", ge=0, le=1)
    num_demonstrations: int = knob(2048, "Synthetic: teacher demonstrations for cold-start "
                                         "SFT (phantomwiki: at most this many).", ge=1)
    train_files: list[str] = knob(None, "User RL data: verl parquet or JSONL files.", factory=list)
    val_files: list[str] = knob(None, "User evaluation data: parquet or JSONL files.", factory=list)
    reward: str = knob("deep_research", "Reward function (§3).", choices=lambda: _registered("REWARDS"))
    judge_url: str | None = knob(None, "OpenAI-compatible endpoint for the llm_judge reward.")
    judge_model: str = knob("Qwen2.5-72B-Instruct", "Judge model name (§3).")
    search_url: str | None = knob(None, "Search-R1 /retrieve server URL; None searches in-process.")
    search_noise: float = knob(0.0, "Synthetic: probability that a search's top page is that of another "
                                    "entity of the same kind, drawn deterministically from the task seed "
                                    "and the query; the teacher sees the wrong title and searches again "
                                    "with a reformulated query (0 = off; at most 0.5).", ge=0, le=0.5)
    search_topk: int = knob(1, "Search results per query (1 keeps the tiny model's "
                               "demonstrations short: it reads one document).", ge=1)
    corpus: str | None = knob(None, "Search corpus JSONL, or 'wiki'; None uses the task's own corpus.")
    search_max_chars: int = knob(300, "Characters of each search hit's text shown to the agent (the "
                                      "release's 300); a longer text is cut and ends in '…' (phantomwiki: "
                                      "400 shows every article whole, docs/tasks-and-rewards.md).",
                                 ge=1)
    phantomwiki_dir: str | None = knob(None, "PhantomWiki: a folder with one universe per split, subfolders train/, "
                                             "test/ and optionally dev/ (else dev is test), each with the generator's "
                                             "articles.json and questions.json; None generates the universes of seeds "
                                             "3·task.seed + 1, 2, 3 (train, dev, test) with the phantomwiki_* settings "
                                             "(the [phantomwiki] extra and SWI-Prolog, docs/tasks-and-rewards.md).")
    phantomwiki_num_trees: int = knob(10, "PhantomWiki: family trees per universe "
                                          "(--num-family-trees; the paper: n/50).", ge=1)
    phantomwiki_tree_size: int = knob(25, "PhantomWiki: most people per family tree "
                                          "(--max-family-tree-size; the paper: 50).", ge=1)
    phantomwiki_tree_depth: int = knob(20, "PhantomWiki: deepest family tree "
                                           "(--max-family-tree-depth; the paper: 20).", ge=1)
    phantomwiki_question_depth: int = knob(10, "PhantomWiki: depth of the question grammar "
                                               "(--question-depth): 10 gives 20 templates and "
                                               "difficulty 1-4 in easy mode; the paper: 20.", ge=2)
    phantomwiki_easy: bool = knob(True, "PhantomWiki: easy mode (--easy-mode: parent/child/sibling/spouse and friend "
                                        "relations only); false is the paper's hard mode (cousins, aunts, in-laws …).")
    phantomwiki_questions_per_template: int = knob(10, "PhantomWiki: questions per template of the dev and "
                                                       "test universes (--num-questions-per-type; "
                                                       "duplicates dropped).", ge=1)
    phantomwiki_train_questions_per_template: int = knob(50, "PhantomWiki: questions per template of the training "
                                                             "universe (duplicates dropped).", ge=1)
    phantomwiki_max_searches: int = knob(4, "PhantomWiki: the teacher demonstrates only training questions its chain "
                                            "answers in at most this many searches (every question still trains RL "
                                            "and is evaluated).", ge=1)
    val_corpus: str | None = knob(None, "File task and evaluation sets: search corpus (JSONL or 'wiki') of the "
                                        "evaluation splits (dev, test, val: task.val_files), e.g. the documents "
                                        "of held-out worlds; None searches task.corpus in every split.")


@dataclass
class RolloutConfig:
    mode: str = knob("aepo", "Tree rollout mode (§1): aepo, arpo, or independent (GRPO: m "
                             "= n, no branching).", choices=("aepo", "arpo", "independent"))
    n: int = knob(8, "Trajectories per prompt, n (§1; release: 12 or 16).", ge=1)
    premonitor: bool = knob(True, "aepo mode: choose m per prompt by entropy pre-monitoring "
                                  "(§1.3; both release scripts switch it off).")
    global_samples: int | None = knob(None, "Fixed global samples m (§1.3); None = pre-monitoring in aepo "
                                            "mode when premonitor is on, else n/2 (release: 6 of 12).", ge=1)
    premonitor_formula: str = knob("paper", "Pre-monitoring formula (§1.3): paper m = n·σ(β(H_root − H_tool)) "
                                            "rounded, or release floor(...)+1 clamped.", choices=("paper", "release"))
    premonitor_beta: float = knob(0.5, "Pre-monitoring sensitivity β (§1.3; release 0.5).", ge=0)
    premonitor_probe_tokens: int = knob(50, "Tokens of the root-entropy probe (§1.3; release 50).", ge=1)
    branch_threshold: float = knob(0.5, "Branch iff P_t ≥ τ (§1.4; release branch_probability 0.5).", ge=0, le=1)
    entropy_weight: float = knob(0.2, "Weight w of ΔH in P_t = U + w·ΔH (§1.4; release 0.2).", ge=0)
    branch_penalty: float = knob(0.05, "Consecutive-branch penalty slope λ, P̂(l) "
                                       "= λ·l (§1.4; release 0.05).", ge=0, le=1)
    penalty_scope: str = knob("path", "Counter l of consecutive branching steps: per path (paper) or per "
                                      "prompt-round (release) (§1.4).", choices=("path", "prompt_round"))
    branch_factor: int = knob(1, "Z: children per branching decision (§1.4; release beam_size − 1 = 1).", ge=1)
    entropy_k_tokens: int = knob(20, "Step entropy over the first k tokens of a segment (§1.2; release 20).", ge=1)
    entropy_measure: str = knob("full", "Token entropy of the step entropy: full-vocabulary entropy (default), "
                                        "surprisal −log π of the sampled token (any engine with log-probs), or the "
                                        "release's top-10 proxy (§1.2). The engine must record it (registry "
                                        "capability `entropies`).", choices=("full", "surprisal", "top10_proxy"))
    entropy_reduce: str = knob("sum", "Step entropy = sum (release) or mean of the first min(k, "
                                      "len) token entropies, / ln|V| (§1.2); mean makes ΔH min(k, "
                                      "len) times smaller (the default before 2026-12-05).",
                               choices=("sum", "mean"))
    entropy_baseline: str = knob("lineage", "ΔH baseline: the trajectory's own root entropy "
                                            "(default) or the release's slot-keyed, never-reset "
                                            "one (§1.4).", choices=("lineage", "slot_persistent"))
    entropy_segment: str = knob("latest", "Segment whose entropy drives branching: after the "
                                          "latest tool result (paper) or the previous one "
                                          "(release) (§1.2).", choices=("latest", "previous"))
    restarts: bool = knob(True, "Start a fresh trajectory, one at a time, when a prompt has none active "
                                "and fewer than n (§1.5); false starts all missing ones at once.")
    temperature: float = knob(0.9, "Sampling temperature for training rollouts (§1.1; release: "
                                   "1.0; 0.9 here for the tiny model, see lab/notebook.md).", gt=0)
    top_p: float = knob(1.0, "Nucleus sampling (§1.1; 1.0 = off).", gt=0, le=1)
    top_k: int = knob(0, "Top-k sampling (0 = off).", ge=0)
    min_p: float = knob(0.0, "Min-p sampling: keep tokens whose tempered probability is at least min_p times the most "
                             "likely one's (0 = off).", ge=0, le=1)
    repetition_penalty: float = knob(1.0, "Penalty on tokens already in the sequence (prompt, model and tool "
                                          "tokens): a logit l becomes l/p if l > 0, else l·p, before "
                                          "temperature (vLLM's and transformers' rule; 1 = off).", gt=0)
    min_tokens: int = knob(0, "Each round generates at least this many tokens (budget permitting): "
                              "EOS cannot be sampled and stop strings (closing tool tags) do not "
                              "end the round before (vLLM's min_tokens; 0 = off).", ge=0)
    ignore_eos: bool = knob(False, "EOS does not end a round (it may still be sampled): only stop strings "
                                   "and the budgets do (vLLM's ignore_eos; for benchmarks of fixed lengths).")
    logprobs_mode: str = knob("raw_logprobs", "What the engine records as each sampled token's log-prob (vLLM's "
                                              "logprobs_mode): raw_logprobs, the untempered policy's; "
                                              "processed_logprobs, the distribution it drew from (after temperature, "
                                              "min-p, top-k, top-p and the repetition penalty, renormalised; verl's "
                                              "default). Rollout Correction takes it as π_rollout (§2.11); engines "
                                              "with the capability processed_logprobs "
                                              "(hf).", choices=("raw_logprobs", "processed_logprobs"))
    max_prompt_length: int = knob(256, "Longest prompt in tokens; a longer one is "
                                       "rejected with an error naming the prompt.", ge=1)
    max_response_length: int = knob(256, "Response budget: model + tool tokens (§1.1; release 6192).", ge=1)
    max_tokens_per_round: int = knob(128, "Most tokens the model generates in one round.", ge=1)
    max_tool_response_tokens: int = knob(96, "Tool results are truncated to this many tokens.", ge=1)
    call_limit: int = knob(6, "Most tool calls per trajectory (§1.1; release 6).", ge=0)
    tool_format: str = knob("xml", "Tool-call format: the release's XML tags or Hermes "
                                   "<tool_call>{json}</tool_call>.", choices=("xml", "hermes"))
    tool_timeout: float = knob(10.0, "Per-call tool timeout in seconds.", gt=0)
    tool_workers: int = knob(8, "Tool calls run concurrently in this many threads.", ge=1)
    sandbox_write_mb: int = knob(64, "Most the python tool's code can write in one call, in MB: its private /tmp "
                                     "(also its working directory, /var/tmp and /dev/shm) is a tmpfs of this size, "
                                     "gone after the call (isolations with a private root, see docs/tools.md).", ge=1)
    sandbox_isolation: str = knob("auto", "Isolation of the python tool's code (docs/tools.md): auto = the "
                                          "strongest mode with a private root that works here (bubblewrap, "
                                          "namespaces, user-namespace), refusing to start when none does; a "
                                          "mode by name, e.g. nobody (root) or none, runs without a private "
                                          "root, with the risks the warning at start and docs/tools.md list.",
                                  choices=("auto", "bubblewrap", "namespaces", "user-namespace", "nobody", "none"))
    tool_error_warn_share: float = knob(0.5, "Warn once (per RL run, per aepo eval) when more than this "
                                             "share (0 to 1) of the tool calls fail: server down or "
                                             "answering errors, sandbox failing or stopping the code, "
                                             "unusable calls (docs/tools.md); 1 = never.", ge=0, le=1)
    cpu_decode_threads: int | None = knob(None, "engine=hf on the CPU: torch threads while the engine generates "
                                                "(the trainer's forward and backward passes keep torch's "
                                                "setting). None: one thread for a policy under 50M parameters, "
                                                "whose small decoding kernels run faster alone than with threads "
                                                "to wake (docs/training.md), torch's setting otherwise.", ge=1)
    cuda_graphs: str = knob("auto", "engine=hf: the static decode path (fixed key/value buffers, one decode step over "
                                    "a 4-D mask) recorded as CUDA graphs and replayed (docs/engines.md). auto: on a "
                                    "GPU, the dynamic path on the CPU (the static one is as fast there but not bitwise "
                                    "the same) and with flash attention; on: the static path everywhere (eager on the "
                                    "CPU); off: the dynamic path (one eager forward per token over a shrinking batch).",
                            choices=("auto", "on", "off"))
    engine: str = knob("hf", "Generation engine: hf (built-in KV-cache decoder), vllm (in-process vLLM, the "
                             "[vllm] extra), or openai (a server).", choices=lambda: _registered("ENGINES"))
    engine_url: str | None = knob(None, "Base URL of an OpenAI-compatible server for "
                                        "engine=openai (e.g. http://127.0.0.1:8000/v1).")
    engine_model: str | None = knob(None, "Model name sent to the engine=openai server; "
                                          "None = model.path (vLLM's default served name).")
    vllm_gpu_memory_utilization: float = knob(0.35, "engine=vllm: share of the GPU's memory vLLM may "
                                                    "take for weights and KV cache (the trainer "
                                                    "needs the rest; docs/gpu.md).", gt=0, le=1)
    vllm_max_model_len: int | None = knob(None, "engine=vllm: longest context vLLM serves; "
                                                "None = the model's own maximum.", ge=1)
    vllm_enforce_eager: bool = knob(False, "engine=vllm: no CUDA graphs / compilation (faster start, slower decoding).")
    vllm_compilation_config: str | None = knob(None, "engine=vllm: vLLM's compilation_config, a YAML/JSON mapping "
                                                     "passed through to vllm.LLM (docs/gpu.md), e.g. the fast start "
                                                     "'{mode: 0, cudagraph_mode: FULL_DECODE_ONLY}': no inductor, CUDA "
                                                     "graphs of whole decode steps; None: vLLM's default (compiles).")
    vllm_sleep: bool = knob(True, "engine=vllm: free vLLM's GPU memory (sleep level 2) while the trainer "
                                  "trains and wake it for the rollout; CUDA only, ignored on the CPU.")
    seed: int = knob(0, "Seed of the uniform draws U (§1.4) and of the engine's sampler.")


# Rollout Correction (§2.11): verl's IS levels, rejection options and bypass loss types.
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
LOSS_TYPES = ("ppo_clip",)
"""Bypass-mode loss types implemented here: verl's ``ppo_clip`` (the configured policy loss with
π_old = π_rollout); verl's ``reinforce`` is not."""


@dataclass
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction`` (§2.11): importance weights and rejection from the rollout
    engine's own log-probs, and the bypass mode that takes them as π_old."""

    rollout_is: str | None = knob(None, "Truncated importance weights π_old/π_rollout on the policy loss (§2.11): "
                                        "token, sequence (the product over the row's trained tokens), or null (off).",
                                  choices=IS_LEVELS)
    rollout_is_threshold: str = knob("2.0", "IS threshold (§2.11): U truncates the weights at U "
                                            "(TIS); L_U (e.g. 0.5_2.0) zeroes them outside [L, "
                                            "U] (IcePop). 0 < L <= U; quote L_U in a YAML file.")
    rollout_is_batch_normalize: bool = knob(False, "Divide the IS weights by their batch mean (§2.11).")
    rollout_rs: str | None = knob(None, "Rejection (§2.11): comma-separated options, all must pass, each "
                                        "token_kX, seq_sum_kX, seq_mean_kX (X = 1, 2, 3) or seq_max_kX (X = "
                                        "2, 3); a rejected token or row leaves the loss mask; null = off.")
    rollout_rs_threshold: str | None = knob(None, "Rejection thresholds (§2.11): one for all options or one per "
                                                  "option, comma-separated; k1 options take L_U or U (ratio "
                                                  "bounds, L = 1/U), k2/k3 options an upper bound U > 0.")
    bypass_mode: bool = knob(False, "π_old = the rollout engine's log-probs: no old-log-prob forward; rejection is "
                                    "then computed from π_θ against π_rollout in each micro-batch (§2.11).")
    loss_type: str = knob("ppo_clip", "Bypass-mode loss (§2.11): ppo_clip = algorithm.policy_loss with π_old "
                                      "= π_rollout (verl's reinforce is not implemented).", choices=LOSS_TYPES)


@dataclass
class AlgorithmConfig:
    """Policy loss and advantage settings; ``aepo_rl.algorithms.PolicyLossConfig`` is this class."""

    policy_loss: str = knob("aepo", "Policy loss (§2, §4): a name in "
                                    "aepo_rl.algorithms.POLICY_LOSSES (yours too, once registered).",
                            choices=lambda: _registered("POLICY_LOSSES"))
    adv_estimator: str = knob("grpo", "Advantage estimator (§2.1, §4): a name in "
                                      "aepo_rl.algorithms.ADVANTAGE_ESTIMATORS (yours too, once registered).",
                              choices=lambda: _registered("ADVANTAGE_ESTIMATORS"))
    clip_ratio_low: float = knob(0.2, "ε_l, lower clip (§2.3; release 0.2).", ge=0, le=1)
    clip_ratio_high: float = knob(0.2, "ε_h, upper clip (§2.3; release 0.2; DAPO/GPPO 0.28).", ge=0)
    clip_ratio_c: float = knob(3.0, "Dual-clip bound c for A < 0 (§2.3; release 3).", gt=1)
    loss_agg_mode: str = knob("token-mean", "verl loss aggregation (§2.5).",
                              choices=("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                       "seq-mean-token-sum-norm"))
    loss_agg_scope: str = knob("mini-batch", "Loss normalised over the whole mini-batch (verl ≥ 0.6; "
                                             "default) or over each micro-batch, micro-batch losses weighted "
                                             "by their share of sequences (release, verl 0.3.1) (§2.5).",
                               choices=("mini-batch", "micro-batch"))
    loss_scale_factor: int | None = knob(None, "Constant divisor T of seq-mean-token-sum-norm "
                                               "(Dr.GRPO, §4; verl's actor.loss_scale_factor) "
                                               "in tokens; None = rollout.max_response_length, "
                                               "the length the release pads responses to.", ge=1)
    entropy_adv_coef: float = knob(0.2, "a in Ã = A·(1 + a·z) (§2.2; release 0.2, silently off); 0 disables.", ge=0)
    entropy_adv_scope: str = knob("mini-batch", "Statistics of z over: micro-batch (release), mini-batch (default) "
                                                "or group (§2.2).", choices=("micro-batch", "mini-batch", "group"))
    entropy_adv_clamp: bool = knob(False, "Clamp the scale 1 + a·z at 0 (§2.2).")
    sg_upper_clip: bool = knob(True, "aepo loss: the upper clip bound keeps a gradient through (1+ε_h)·r/sg(r) (§2.3); "
                                     "false = PPO's hard clip (the paper's ablation of the stop-gradient clip).")
    grad_preserve_entropy_quantile: float | None = knob(None, "Preserve the upper-clip gradient only for tokens "
                                                              "above this entropy quantile (§2.3 paper); None = "
                                                              "every token (release).", ge=0, le=1)
    tempered_logprobs: bool = knob(False, "Log-probs, ratios and entropies of training from logits / "
                                          "rollout.temperature, the distribution the rollout sampled "
                                          "(verl's actor; official); False: the untempered policy's, "
                                          "as the engine records them. The two agree at temperature 1.")
    gamma: float = knob(1.0, "Discount γ for REINFORCE++ returns (§4).", ge=0, le=1)
    norm_adv_by_std: bool = knob(True, "Divide group advantages by their std (False = Dr.GRPO) (§4).")
    gigpo_step_weight: float = knob(1.0, "ω: weight of GiGPO's step advantage (§4).", ge=0)
    use_kl_loss: bool = knob(False, "KL to the reference as a loss term (§2.4: off in the release).")
    kl_loss_coef: float = knob(0.001, "KL loss coefficient.", ge=0)
    kl_loss_type: str = knob("low_var_kl", "KL estimator: k1, k2, k3 (= low_var_kl).",
                             choices=("k1", "k2", "k3", "low_var_kl"))
    use_kl_in_reward: bool = knob(False, "KL penalty folded into token rewards (REINFORCE++).")
    kl_coef: float = knob(0.001, "KL-in-reward coefficient.", ge=0)
    entropy_coeff: float = knob(0.0, "Entropy bonus coefficient (§2.4: 0 in the release).", ge=0)
    dynamic_sampling: bool = knob(False, "DAPO: drop groups whose rewards are all equal (§4).")
    overlong_buffer_len: int = knob(0, "DAPO overlong shaping: soft-penalty window in tokens; 0 = off (§4).", ge=0)
    overlong_penalty_factor: float = knob(1.0, "DAPO overlong shaping: penalty at the hard limit.", ge=0)
    rollout_correction: RolloutCorrectionConfig = knob(None, "Rollout Correction (§2.11, verl's names).",
                                                       factory=RolloutCorrectionConfig)


@dataclass
class SFTConfig:
    epochs: int = knob(12, "Cold-start SFT epochs (§5; release: 3; 12 here for "
                           "the tiny model, see lab/notebook.md).", ge=0)
    lr: float = knob(3e-3, "Peak learning rate (release: 7e-6 for a 14B model; 3e-3 "
                           "here for the tiny model, see lab/notebook.md).", gt=0)
    batch_size: int = knob(32, "Sequences per optimizer step (32 here for the tiny model, see lab/notebook.md).", ge=1)
    warmup_ratio: float = knob(0.05, "Share of steps of linear warm-up before cosine decay.", ge=0, le=1)
    weight_decay: float = knob(0.01, "AdamW weight decay.", ge=0)
    max_length: int = knob(512, "Demonstrations are truncated to this many tokens.", ge=8)
    data: list[str] = knob(None, "Your own demonstrations instead of the task's: JSONL, JSON or parquet files of chat "
                                 "messages, ShareGPT conversations or TRL prompt/completion rows (docs/training.md).",
                           factory=list)


@dataclass
class TrainerConfig:
    steps: int = knob(80, "RL steps (§5; release 80).", ge=0)
    batch_size: int = knob(8, "Prompts per RL step (§2.4; release 64).", ge=1)
    mini_batch_size: int = knob(4, "Prompts per optimizer step (§2.4; release 8). Left unset, it follows a smaller "
                                   "trainer.batch_size down (one optimizer step per RL step).", ge=1)
    micro_batch_size: int = knob(16, "Sequences per forward/backward (gradient accumulation bounds memory).", ge=1)
    ppo_epochs: int = knob(1, "Passes over each RL batch (§2.4; release 1).", ge=1)
    lr: float = knob(1e-4, "AdamW learning rate (release 1e-6 for 14B models).", gt=0)
    weight_decay: float = knob(0.01, "AdamW weight decay (§2.4).", ge=0)
    grad_clip: float = knob(1.0, "Gradient-norm clip (§2.4).", gt=0)
    lr_schedule: str = knob("constant", "Learning-rate schedule (§2.4: constant).", choices=("constant", "cosine"))
    warmup_steps: int = knob(0, "Linear warm-up steps.", ge=0)
    bf16: bool = knob(False, "bf16 autocast for the forward passes (on the device's type, docs/gpu.md).")
    device: str = knob("auto", "Device of the policy, the reference model, every training batch and the HF engine's "
                               "caches and sampler: auto (cuda when torch sees a GPU, else cpu), cpu, cuda or cuda:N "
                               "(docs/gpu.md).")
    eval_every: int = knob(20, "Evaluate every k RL steps too, so the pass@1 curve has points between its "
                               "ends (0 = only before and after RL); each evaluation restores the random "
                               "states it drew from, so it changes the run's time, not its training.", ge=0)
    save_every: int = knob(1, "Checkpoint every k steps.", ge=1)
    keep_checkpoints: int = knob(2, "Keep only the newest k step checkpoints (the SFT model is always kept).", ge=1)
    max_gen_batches: int = knob(3, "DAPO dynamic sampling: most rollout batches per step to "
                                   "refill dropped groups (§4; verl max_num_gen_batches).", ge=1)
    rollouts_to_save: int = knob(16, "Trajectories written to rollouts/step_<k>.jsonl each step.", ge=0)
    run_dir: str = knob("runs", "Parent folder of runs.")
    run_name: str | None = knob(None, "Run folder name; None = '<preset>-<timestamp>'.")
    seed: int = knob(0, "Seed of data order, initialisation and sampling.")
    tensorboard: bool = knob(True, "Write TensorBoard event files.")
    wandb_project: str | None = knob(None, "Log to Weights & Biases under this project when wandb is installed.")
    target_kl: float | None = knob(None, "Stop an RL step's remaining mini-batches (and PPO epochs) once a "
                                         "mini-batch's actor/approx_kl to π_old (k3, nats per token) "
                                         "exceeds this; that mini-batch is not stepped either "
                                         "(docs/training.md \"Staying on-policy\"); None = off.", gt=0)
    warn_steps: int = knob(3, "Consecutive RL steps a warning's condition must hold before it is printed "
                              "(docs/training.md \"Staying on-policy\").", ge=1)
    warn_clipfrac: float = knob(0.02, "Warn far off-policy when actor/pg_clipfrac exceeds this (normal 0.001-0.005).",
                                gt=0, le=1)
    warn_ppo_kl: float = knob(0.02, "Warn far off-policy when actor/ppo_kl exceeds this, in nats per token.", gt=0)
    warn_mismatch_kl: float = knob(0.001, "Warn when the training-rollout mismatch "
                                          "rollout_corr/k3_kl exceeds this.", gt=0)
    warn_entropy_window: int = knob(10, "Warn when actor/entropy halves or grows by half, moving the same "
                                        "way in at least 70% of the steps, over this many steps.", ge=3)


@dataclass
class EvalConfig:
    split: str = knob("test", "Split evaluated before and after RL.")
    samples: int = knob(4, "Samples per question K for pass@k (§5; paper 5).", ge=1)
    num_questions: int | None = knob(None, "Evaluate only the first N questions; None = all.", ge=1)
    greedy: bool = knob(False, "Greedy decoding (pass@1 from one sample).")
    temperature: float = knob(0.6, "Evaluation temperature (§5: 0.6).", gt=0)
    top_p: float = knob(0.95, "Evaluation top_p (§5: 0.95).", gt=0, le=1)
    top_k: int = knob(20, "Evaluation top_k (§5: 20).", ge=0)
    batch_size: int = knob(16, "Questions per rollout call during evaluation (bounds engine memory).", ge=1)


@dataclass
class Config:
    preset: str = knob("aepo", "Name of the preset this config started from.")
    model: ModelConfig = knob(None, "Policy model.", factory=ModelConfig)
    task: TaskConfig = knob(None, "Task, tools' data and reward.", factory=TaskConfig)
    rollout: RolloutConfig = knob(None, "Tree rollout (§1).", factory=RolloutConfig)
    algorithm: AlgorithmConfig = knob(None, "Policy update (§2).", factory=AlgorithmConfig)
    sft: SFTConfig = knob(None, "Cold-start SFT (§5).", factory=SFTConfig)
    trainer: TrainerConfig = knob(None, "RL loop.", factory=TrainerConfig)
    eval: EvalConfig = knob(None, "Evaluation.", factory=EvalConfig)


# Presets: dotted overrides on top of the defaults (the defaults are the `aepo` preset,
# the paper's intent). Each names the section of docs/algorithm.md it follows.
PRESETS: dict[str, dict[str, Any]] = {
    "aepo": {},
    # §1.3-§1.4 and §2.2-§2.4 (release): fixed m, release formulas and quirks, entropy-aware
    # advantage silently off because entropy_coeff = 0, micro-batch statistics, log-probs of the
    # tempered logits (verl's actor divides them by the rollout temperature), the loss normalised
    # per micro-batch (verl 0.3.1's dp_actor).
    "official": {
        "rollout.mode": "aepo", "rollout.penalty_scope": "prompt_round",
        "rollout.entropy_measure": "top10_proxy", "rollout.entropy_baseline": "slot_persistent",
        "rollout.entropy_segment": "previous", "rollout.premonitor_formula": "release",
        "rollout.premonitor": False, "algorithm.policy_loss": "aepo",
        "algorithm.entropy_adv_coef": 0.0, "algorithm.entropy_adv_scope": "micro-batch",
        "algorithm.tempered_logprobs": True, "algorithm.loss_agg_scope": "micro-batch",
    },
    "arpo": {"rollout.mode": "arpo", "algorithm.policy_loss": "ppo", "algorithm.entropy_adv_coef": 0.0},
    # Control (§1.4 with w = 0): arpo whose branch decisions ignore the entropy, P = U: random branching at
    # arpo's budget, the test of "entropy-guided" (TreeRL's and TreePO's random-branching baseline).
    "arpo_random": {"rollout.mode": "arpo", "rollout.entropy_weight": 0.0, "algorithm.policy_loss": "ppo",
                    "algorithm.entropy_adv_coef": 0.0},
    "grpo": {"rollout.mode": "independent", "algorithm.policy_loss": "ppo", "algorithm.entropy_adv_coef": 0.0},
    "dapo": {"rollout.mode": "independent", "algorithm.policy_loss": "dapo", "algorithm.clip_ratio_high": 0.28,
             "algorithm.dynamic_sampling": True, "algorithm.overlong_buffer_len": 64,
             "algorithm.entropy_adv_coef": 0.0},
    "gppo": {"rollout.mode": "independent", "algorithm.policy_loss": "gppo", "algorithm.clip_ratio_high": 0.28,
             "algorithm.entropy_adv_coef": 0.0},
    # CISPO paper (§4): the IS weight is capped from above only; ε_l = 1 makes the lower bound 0.
    "cispo": {"rollout.mode": "independent", "algorithm.policy_loss": "cispo", "algorithm.clip_ratio_high": 0.28,
              "algorithm.clip_ratio_low": 1.0, "algorithm.entropy_adv_coef": 0.0},
    "gspo": {"rollout.mode": "independent", "algorithm.policy_loss": "gspo", "algorithm.clip_ratio_low": 0.0003,
             "algorithm.clip_ratio_high": 0.0004, "algorithm.loss_agg_mode": "seq-mean-token-mean",
             "algorithm.entropy_adv_coef": 0.0},
    "reinforce_plus_plus": {"rollout.mode": "independent", "algorithm.policy_loss": "ppo",
                            "algorithm.adv_estimator": "reinforce_plus_plus", "algorithm.entropy_adv_coef": 0.0},
    "gigpo": {"rollout.mode": "independent", "algorithm.policy_loss": "ppo", "algorithm.adv_estimator": "gigpo",
              "algorithm.entropy_adv_coef": 0.0},
    "dr_grpo": {"rollout.mode": "independent", "algorithm.policy_loss": "ppo", "algorithm.adv_estimator": "dr_grpo",
                "algorithm.norm_adv_by_std": False, "algorithm.loss_agg_mode": "seq-mean-token-sum-norm",
                "algorithm.entropy_adv_coef": 0.0},
    # Ablations (the paper's own): aepo with one component switched off.
    "aepo_no_premonitor": {"rollout.premonitor": False},  # §1.3: m = n/2 for every prompt
    "aepo_no_branch_penalty": {"rollout.branch_penalty": 0.0},  # §1.4: P̂(l) = 0
    "aepo_no_sg_clip": {"algorithm.sg_upper_clip": False},  # §2.3: hard upper clip
    "aepo_no_entropy_adv": {"algorithm.entropy_adv_coef": 0.0},  # §2.2: Ã = A
}

# Task defaults: what a task needs from the rest of the config (lengths, SFT, RL budget), applied by
# load_config when task.name names the task, to every key the preset, the YAML file and the overrides leave
# unset; algorithm keys stay the presets' own, so every preset (and `aepo compare`) runs on the task.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    # docs/tasks-and-rewards.md "PhantomWiki: the recipe"; measured in lab/notebook.md.
    "phantomwiki": {
        "task.search_max_chars": 600, "rollout.max_tool_response_tokens": 192,
        "rollout.max_response_length": 768, "sft.max_length": 1024,
    },
}


TRL_ALIASES: dict[str, str] = {
    "learning_rate": "trainer.lr", "num_generations": "rollout.n", "max_steps": "trainer.steps",
    "max_completion_length": "rollout.max_response_length", "max_prompt_length": "rollout.max_prompt_length",
    "temperature": "rollout.temperature", "top_p": "rollout.top_p", "top_k": "rollout.top_k", "min_p": "rollout.min_p",
    "repetition_penalty": "rollout.repetition_penalty", "epsilon": "algorithm.clip_ratio_low",
    "epsilon_high": "algorithm.clip_ratio_high", "delta": "algorithm.clip_ratio_c", "seed": "trainer.seed",
    "save_steps": "trainer.save_every", "save_total_limit": "trainer.keep_checkpoints",
    "eval_steps": "trainer.eval_every", "warmup_steps": "trainer.warmup_steps", "weight_decay": "trainer.weight_decay",
    "max_grad_norm": "trainer.grad_clip",
    "num_iterations": "trainer.ppo_epochs", "bf16": "trainer.bf16", "run_name": "trainer.run_name",
    "gradient_checkpointing": "model.gradient_checkpointing", "num_generations_eval": "eval.samples",
}
"""TRL ``GRPOConfig`` / transformers ``TrainingArguments`` names with the same meaning as one of our keys: the
messages for an unknown key name ours, and :class:`aepo_rl.AEPOTrainer` accepts them as keyword arguments."""

TRL_NEAR: dict[str, str] = {
    "beta": "a KL term to the reference is algorithm.use_kl_loss=true with algorithm.kl_loss_coef=<beta>",
    "per_device_train_batch_size": "trainer.batch_size counts prompts (TRL's per_device_train_batch_size / "
                                   "num_generations); each prompt gets rollout.n trajectories",
    "gradient_accumulation_steps": "trainer.mini_batch_size (prompts per optimizer step) and trainer.micro_batch_size "
                                   "(sequences per forward and backward)",
    "num_train_epochs": "RL here counts steps, not epochs: trainer.steps steps of trainer.batch_size prompts each",
    "logging_steps": "every RL step is logged (metrics.jsonl, TensorBoard): there is nothing to set",
    "loss_type": "algorithm.loss_agg_mode (TRL's dapo is token-mean, grpo is seq-mean-token-mean)",
    "scale_rewards": "algorithm.norm_adv_by_std (true: TRL's scale_rewards='group'; false: 'none')",
    "report_to": "trainer.tensorboard and trainer.wandb_project",
    "use_vllm": "rollout.engine=vllm (docs/engines.md)",
    "use_cpu": "trainer.device=cpu",
    "lr_scheduler_type": "trainer.lr_schedule (constant or cosine)",
    "warmup_ratio": "trainer.warmup_steps (RL) or sft.warmup_ratio (cold-start SFT)",
    "per_device_eval_batch_size": "eval.batch_size (questions per rollout call)",
    "output_dir": "AEPOTrainer(output_dir=...), or trainer.run_dir and trainer.run_name",
    "reward_weights": "AEPOTrainer(reward_weights=[...])",
}
"""TRL / transformers names without an exact counterpart: what to set instead."""


def trl_hint(name: str) -> str:
    """What ``name`` (a bare or dotted key whose last part may be a TRL name) is called here, or ""."""
    last = name.rsplit(".", 1)[-1]
    if last in TRL_ALIASES:
        return f"; TRL's {last} is {TRL_ALIASES[last]} here"
    if last in TRL_NEAR:
        return f"; TRL's {last} has no exact counterpart here: {TRL_NEAR[last]}"
    return ""


def _closest(name: str, options: list[str]) -> str:
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    return f"; did you mean '{match[0]}'?" if match else ""


def _leaf_keys(obj: Any, prefix: str = "") -> list[str]:
    """Every settable dotted key under the section ``obj`` (``trainer.steps``, ``model.tiny_hidden_size`` …)."""
    keys = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        keys += _leaf_keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [prefix + f.name]
    return keys


def _closest_key(name: str, cfg: Config) -> str:
    """The hint for an unknown top-level key ``name`` (``steps=10``): the keys whose last part is ``name``
    (``trainer.steps``), else a section spelled almost so (``modle``), else the keys whose last part is close."""
    leaves = [key for key in _leaf_keys(cfg) if "." in key]
    found = [key for key in leaves if key.rsplit(".", 1)[1] == name]
    sections = difflib.get_close_matches(name, [f.name for f in dataclasses.fields(cfg)], n=1, cutoff=0.75)
    if not found and sections:
        return f"; did you mean '{sections[0]}'?"
    if not found:
        close = difflib.get_close_matches(name, [key.rsplit(".", 1)[1] for key in leaves], n=3, cutoff=0.75)
        found = [key for key in leaves if key.rsplit(".", 1)[1] in close]
    return f"; did you mean {' or '.join(repr(key) for key in found[:3])}?" if found else ""


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML / command-line value to the field's declared type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "~")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.strip("[]").split(",") if v.strip()] if value.strip() else []
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v.strip() if isinstance(v, str) else v, args[0], key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if tp is str:
        if value is None:
            raise ConfigError(f"{key}: expected a string, got null")
        if isinstance(value, bool):  # YAML 1.1 reads on/off (and yes/no, true/false) as booleans
            return "on" if value else "off"
        return str(value)
    return value


def set_key(cfg: Config, dotted: str, value: Any) -> None:
    """Set ``section.field`` (or a top-level field) on ``cfg``, coercing the value's type."""
    parts = dotted.split(".")
    obj: Any = cfg
    for depth, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(obj)]
        if part not in names:
            prefix = ".".join(parts[:depth])
            full = [f"{prefix}.{n}" if prefix else n for n in names]
            close = _closest_key(dotted, cfg) if depth == 0 and len(parts) == 1 else _closest(dotted, full)
            hint = trl_hint(dotted) or close or f"; valid keys: {', '.join(full)}"
            raise ConfigError(f"unknown config key '{dotted}'{hint}")
        tp = _field_types(type(obj))[part]
        if depth == len(parts) - 1:
            if _is_section(tp):
                if not isinstance(value, dict):
                    raise ConfigError(f"'{dotted}' is a section; set one of its keys, e.g. {dotted}.<key>=…")
                for k, v in value.items():
                    set_key(cfg, f"{dotted}.{k}", v)
            else:
                setattr(obj, part, _coerce(value, tp, dotted))
            return
        if not _is_section(tp):
            raise ConfigError(f"'{'.'.join(parts[:depth + 1])}' is not a section; '{dotted}' cannot be set")
        obj = getattr(obj, part)


CIRCUIT_MIN_HEAD_DIM = 30
"""The induction circuit's head needs this many dimensions: RoPE pairs for the previous-token match and
for the token match (aepo_rl/models/copy_warmup.py)."""


def circuit_heads(hidden_size: int, head_dim: int) -> int:
    """Key/value heads each layer of the induction circuit uses: one per ``head_dim`` coordinates of the
    half of the residual stream it moves (aepo_rl/models/copy_warmup.py)."""
    return -(-(hidden_size // 2) // head_dim)


def circuit_shape_error(hidden_size: int, layers: int, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """Why a tiny model of these sizes cannot hold the induction circuit (``model.tiny_init=induction``),
    naming the ``model.tiny_*`` keys and a fix, or None."""
    sizes = f"model.tiny_hidden_size={hidden_size} with model.tiny_head_dim={head_dim}"
    if layers < 2:
        return (f"the induction circuit (model.tiny_init=induction) needs at least 2 layers, got "
                f"model.tiny_num_layers={layers}: set model.tiny_num_layers=2, or model.tiny_init=random")
    if head_dim < CIRCUIT_MIN_HEAD_DIM:
        return ("the induction circuit (model.tiny_init=induction) needs model.tiny_head_dim >= "
                f"{CIRCUIT_MIN_HEAD_DIM} (RoPE pairs for its position and token matches), got {head_dim}: "
                "raise model.tiny_head_dim (64 is the default), or set model.tiny_init=random")
    needed = circuit_heads(hidden_size, head_dim)
    if needed > kv_heads:
        wider = -(-(hidden_size // 2) // kv_heads)
        return (f"{sizes} needs {needed} key/value heads for the induction circuit (model.tiny_init=induction: each "
                f"layer moves hidden_size/2 = {hidden_size // 2} coordinates, head_dim per head), but "
                f"model.tiny_num_kv_heads={kv_heads}: set model.tiny_num_heads={max(needed, heads)} "
                f"model.tiny_num_kv_heads={needed}, or model.tiny_head_dim={max(wider, CIRCUIT_MIN_HEAD_DIM)}, "
                "or model.tiny_init=random")
    return None


def tiny_shape_error(model: ModelConfig) -> str | None:
    """Why the ``model.tiny_*`` sizes cannot build the tiny model (heads that do not group, or a shape
    without room for the induction circuit when ``model.tiny_init=induction``), or None."""
    if model.tiny_num_heads % model.tiny_num_kv_heads:
        return (f"model.tiny_num_heads={model.tiny_num_heads} must be a multiple of model.tiny_num_kv_heads="
                f"{model.tiny_num_kv_heads} (each key/value head serves a group of query heads): set them equal, "
                "or the heads to a multiple")
    if model.tiny_init != "induction":
        return None
    return circuit_shape_error(model.tiny_hidden_size, model.tiny_num_layers, model.tiny_num_heads,
                               model.tiny_num_kv_heads, model.tiny_head_dim)


def _leaves(obj: Any, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, value) of every non-section field of ``obj``, sections (and their sub-sections,
    such as ``algorithm.rollout_correction``) expanded in declaration order."""
    out = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        out += _leaves(value, f"{key}.") if dataclasses.is_dataclass(value) else [(key, f, value)]
    return out


def validate(cfg: Config) -> Config:
    """Check every field against its allowed range or choices; return ``cfg``."""
    for key, f, value in _leaves(cfg):
        meta = f.metadata
        if "." not in key or value is None:  # top-level scalars (preset) are not checked
            continue
        choices = meta["choices"]() if callable(meta.get("choices")) else meta.get("choices")
        if choices and value not in choices:
            hint = " (or load the module that registers it: aepo --plugin MODULE)" \
                if isinstance(choices, registry.Registry) else ""
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of {list(choices)}{hint}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{key}={value} must be a finite number")
            bounds = []
            if meta.get("ge") is not None and value < meta["ge"]:
                bounds.append(f">= {meta['ge']}")
            if meta.get("gt") is not None and value <= meta["gt"]:
                bounds.append(f"> {meta['gt']}")
            if meta.get("le") is not None and value > meta["le"]:
                bounds.append(f"<= {meta['le']}")
            if bounds:
                raise ConfigError(f"{key}={value} is out of range: it must be {' and '.join(bounds)}")
    if not DEVICE_NAME.fullmatch(cfg.trainer.device):
        raise ConfigError(f"trainer.device={cfg.trainer.device!r} is not allowed; choose one of {list(DEVICES)} "
                          "(N = a GPU index, e.g. cuda:1)")
    if cfg.model.path is None and cfg.model.init is None and (error := tiny_shape_error(cfg.model)):
        raise ConfigError(error)
    if cfg.trainer.mini_batch_size > cfg.trainer.batch_size:
        raise ConfigError(f"trainer.mini_batch_size={cfg.trainer.mini_batch_size} must be <= "
                          f"trainer.batch_size={cfg.trainer.batch_size}: lower trainer.mini_batch_size, "
                          "or leave it unset (it then follows a smaller trainer.batch_size)")
    if cfg.task.val_corpus and cfg.task.search_url:
        raise ConfigError(f"task.val_corpus={cfg.task.val_corpus} is searched in-process, but task.search_url="
                          f"{cfg.task.search_url} answers every split's searches: unset one (to evaluate on another "
                          "server's corpus, run `aepo eval` with that server's task.search_url)")
    if cfg.task.min_hops > cfg.task.max_hops:
        raise ConfigError(f"task.min_hops={cfg.task.min_hops} must be <= task.max_hops={cfg.task.max_hops}: "
                          f"raise task.max_hops or lower task.min_hops")
    vllm_compilation_config(cfg.rollout)
    if cfg.rollout.global_samples is not None and cfg.rollout.global_samples > cfg.rollout.n:
        raise ConfigError(f"rollout.global_samples={cfg.rollout.global_samples} must be <= rollout.n={cfg.rollout.n}")
    check_rollout_correction(cfg)
    return cfg


# Rollout Correction's threshold specs (§2.11), parsed here so that validating a config needs no torch;
# aepo_rl.algorithms.rollout_correction uses them.


def parse_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """(upper, lower or None) from ``rollout_is_threshold``: "U" truncates at U (TIS), "L_U" keeps
    [L, U] (IcePop). ValueError on anything else, as verl's ``_parse_rollout_is_threshold``."""
    text = str(spec).strip()
    lower_text, _, upper_text = text.rpartition("_") if "_" in text else ("", "", text)
    try:
        upper, lower = float(upper_text), (float(lower_text) if lower_text else None)
    except ValueError:
        raise ValueError(f"{spec!r} is not a number U or a range L_U") from None
    if not upper > 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{spec!r}: need 0 < L <= U")
    return upper, lower


def rs_options(rs: str) -> list[str]:
    """The distinct options of a comma-separated ``rollout_rs``, in order; ValueError on an unknown one."""
    options = list(dict.fromkeys(part.strip() for part in rs.split(",") if part.strip()))
    unknown = [o for o in options if o not in RS_OPTIONS]
    if unknown or not options:
        raise ValueError(f"unknown option(s) {unknown or [rs]}; choose among {list(RS_OPTIONS)}, comma-separated")
    return options


def parse_rs_thresholds(options: list[str], spec: str | float | None) -> dict[str, tuple[float | None, float]]:
    """(lower, upper) per option from ``rollout_rs_threshold``: one spec for all options or one per option,
    comma-separated; k1 options take "L_U" or "U" (L = 1/U, ratio bounds), the others one upper bound.
    ValueError on a malformed or non-positive spec, as verl's ``_parse_rollout_rs_thresholds``."""
    if spec is None:
        raise ValueError("rejection needs a threshold")
    specs = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(specs) not in (1, len(options)):
        raise ValueError(f"give one threshold for all {len(options)} options or one per option, got {len(specs)}")
    specs = specs * len(options) if len(specs) == 1 else specs
    out = {}
    for option, text in zip(options, specs):
        if option.endswith("k1"):
            upper, lower = parse_is_threshold(text)
            out[option] = (1.0 / upper if lower is None else lower, upper)
        else:
            if "_" in text:
                raise ValueError(f"{option} takes one upper bound, not a range ({text!r})")
            upper, _ = parse_is_threshold(text)
            out[option] = (None, upper)
    return out


def uses_rollout_log_probs(cfg: Config) -> bool:
    """Whether the update needs the rollout engine's log-probs (any Rollout Correction setting, §2.11)."""
    rc = cfg.algorithm.rollout_correction
    return rc.rollout_is is not None or rc.rollout_rs is not None or rc.bypass_mode


def check_rollout_correction(cfg: Config) -> None:
    """Refuse a malformed ``algorithm.rollout_correction`` threshold, a rejection without one, a correction
    whose log-probs would not be comparable (tempered training log-probs against untempered recorded ones,
    §2.11), and a surprisal step entropy read from processed log-probs."""
    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    try:
        parse_is_threshold(rc.rollout_is_threshold)
    except ValueError as err:
        raise ConfigError(f"{key}.rollout_is_threshold={rc.rollout_is_threshold!r}: {err}; write U (e.g. 2.0) "
                          "or L_U (e.g. 0.5_2.0)") from None
    if rc.rollout_rs is not None:
        try:
            options = rs_options(rc.rollout_rs)
        except ValueError as err:
            raise ConfigError(f"{key}.rollout_rs={rc.rollout_rs!r}: {err}") from None
        if rc.rollout_rs_threshold is None:
            raise ConfigError(f"{key}.rollout_rs={rc.rollout_rs!r} needs {key}.rollout_rs_threshold (e.g. 0.5_2.0 for "
                              "k1 options, 0.01 for k2/k3 ones)")
        try:
            parse_rs_thresholds(options, rc.rollout_rs_threshold)
        except ValueError as err:
            raise ConfigError(f"{key}.rollout_rs_threshold={rc.rollout_rs_threshold!r}: {err}") from None
    if (uses_rollout_log_probs(cfg) and cfg.algorithm.tempered_logprobs and cfg.rollout.temperature != 1
            and cfg.rollout.logprobs_mode == "raw_logprobs"):
        raise ConfigError(f"{key} compares the trainer's log-probs with the engine's, which are untempered "
                          "(rollout.logprobs_mode=raw_logprobs), but algorithm.tempered_logprobs=true makes the "
                          f"trainer's tempered (rollout.temperature={cfg.rollout.temperature}): set "
                          "rollout.logprobs_mode=processed_logprobs (the engine then records the tempered "
                          "log-probs), or algorithm.tempered_logprobs=false, or turn the correction off")
    if (error := surprisal_logprobs_error(cfg.rollout)) is not None:
        raise ConfigError(error)


def surprisal_logprobs_error(rollout: RolloutConfig) -> str | None:
    """Why the tree's fork entropy cannot read the engine's recorded log-probs (``rollout.entropy_measure=surprisal``
    with ``rollout.logprobs_mode=processed_logprobs``), or None."""
    if (rollout.logprobs_mode == "raw_logprobs" or rollout.entropy_measure != "surprisal"
            or rollout.mode == "independent"):
        return None
    return ("rollout.entropy_measure=surprisal reads the engine's recorded log-probs, which "
            f"rollout.logprobs_mode={rollout.logprobs_mode} makes those of the tempered, "
            "filtered distribution rather than the policy's (§1.2): set "
            "rollout.entropy_measure=full or top10_proxy, or rollout.logprobs_mode=raw_logprobs")


def vllm_compilation_config(rollout: RolloutConfig) -> dict | None:
    """``rollout.vllm_compilation_config`` as the mapping vLLM takes (a command-line ``{...}`` arrives as
    its Python spelling, which YAML also reads), or None."""
    text = rollout.vllm_compilation_config
    if text is None:
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"rollout.vllm_compilation_config={text!r} must be a mapping of vLLM's CompilationConfig "
                          "fields, e.g. '{mode: 0, cudagraph_mode: FULL_DECODE_ONLY}'")
    return value


NUMBER_RANGE = re.compile(r"[0-9.eE+-]+_[0-9.eE+-]+(,[0-9.eE+-]+(_[0-9.eE+-]+)?)*")
"""An L_U threshold (``algorithm.rollout_correction.*_threshold``, §2.11), kept as written: int() and
float() read digit-separating underscores themselves, so numeric keys are unaffected."""


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are read as YAML scalars (``0.28``, ``true``, ``[a,b]``)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like section.key=value")
        key, raw = item.split("=", 1)
        if NUMBER_RANGE.fullmatch(raw.strip()):  # YAML 1.1 would read 0.5_2 as the number 0.52
            out[key.strip()] = raw.strip()
            continue
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def _dotted(key: str, value: Any) -> list[str]:
    """The dotted keys a YAML entry sets (a section's mapping stands for each of its keys)."""
    if isinstance(value, dict):
        return [k for sub, v in value.items() for k in _dotted(f"{key}.{sub}", v)]
    return [key]


def load_config(preset: str = "aepo", yaml_path: str | Path | None = None,
                overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """Build a config: preset defaults, then a YAML file, then dotted overrides, then the task's defaults
    (``TASK_DEFAULTS[task.name]``) for every key none of those set; validated."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset '{preset}'{_closest(preset, list(PRESETS))} (presets: {', '.join(PRESETS)})")
    cfg = Config(preset=preset)
    explicit = set(PRESETS[preset])  # keys the task defaults leave alone (sections stand for their keys)
    for key, value in PRESETS[preset].items():
        set_key(cfg, key, value)
    data: dict = {}
    if yaml_path is not None:
        path = Path(yaml_path)
        if not path.is_file():
            raise ConfigError(f"--config {path}: no such file; give the path of a YAML file of config sections "
                              "(`aepo config show --yaml` prints one)")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
        if "preset" in data and data["preset"] != preset:
            return load_config(data["preset"], yaml_path, overrides)
        for key, value in data.items():
            if key == "preset":
                continue
            set_key(cfg, key, value)
            explicit.update(_dotted(key, value))
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    for key, value in (overrides or {}).items():
        set_key(cfg, key, value)
        explicit.add(key)
    for key, value in TASK_DEFAULTS.get(cfg.task.name, {}).items():
        if not any(key == set_ or key.startswith(f"{set_}.") for set_ in explicit):
            set_key(cfg, key, value)
    in_yaml = "trainer.mini_batch_size" in data or "mini_batch_size" in (data.get("trainer") or {})
    carry_mini_batch(cfg, in_yaml or "trainer.mini_batch_size" in (overrides or {}))
    return validate(cfg)


def carry_mini_batch(cfg: Config, given: bool) -> None:
    """``trainer.batch_size`` below ``trainer.mini_batch_size`` that the user did not set (``given``: they did; the
    preset's value does not count): the mini-batch follows it down, one optimizer step per RL step. A mini-batch the
    user set stays, and :func:`validate` names the conflict."""
    if not given and cfg.trainer.mini_batch_size > cfg.trainer.batch_size:
        cfg.trainer.mini_batch_size = cfg.trainer.batch_size


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a config from ``to_dict`` output (e.g. a run's config.yaml)."""
    preset = data.get("preset", "aepo")
    cfg = Config(preset=preset)
    for key, value in data.items():
        if key != "preset":
            set_key(cfg, key, value)
    return validate(cfg)


@dataclass(frozen=True)
class FieldInfo:
    """One config field as documented: dotted key, declared type, current value, doc and limits."""

    key: str
    type: str
    value: Any
    doc: str
    choices: tuple | None
    ge: float | None
    gt: float | None
    le: float | None


def fields_info(cfg: Config) -> list[FieldInfo]:
    """Every field of ``cfg`` (top-level scalars, then each section's fields) with its metadata."""
    rows = []
    for key, f, value in _leaves(cfg):
        meta = f.metadata
        choices = meta.get("choices")
        rows.append(FieldInfo(key, str(f.type), value, meta.get("doc", ""),
                              tuple(choices() if callable(choices) else choices) if choices else None,
                              meta.get("ge"), meta.get("gt"), meta.get("le")))
    return rows


def describe(cfg: Config) -> list[tuple[str, Any, str]]:
    """(key, value, documentation) for every field, for `aepo config show`."""
    return [(row.key, row.value, row.doc) for row in fields_info(cfg)]
