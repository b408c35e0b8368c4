"""Helpers the tests share: fakes of tasks and engines, tiny models, configs and scripts (one module, so that no test
imports another)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from fakes import EchoSearch
from transformers import Qwen3ForCausalLM

from aepo_rl.config import RolloutConfig, load_config
from aepo_rl.engines.base import SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.engines.openai import OpenAIEngine
from aepo_rl.protocol import token_tags
from aepo_rl.rollout.trajectory import Round, Trajectory
from aepo_rl.tasks.base import Demonstration, Example
from aepo_rl.tasks.phantomwiki import INSTALL
from aepo_rl.train.rl import Batch, FixedTensors

# ---------------------------------------------------------------- a tiny random Qwen3, its byte-level BPE tokenizer

_SAMPLE_TEXT = (
    "<think>I need to find who founded Velmora.</think> <search>Velmora founder</search>"
    " <result>\nPage 1: Velmora — Velmora was founded in 1874 by Ada Korrin.\n</result>"
    " <python>print(2024 - 1874)</python> <result>\n150\n</result>"
    " <answer>\\boxed{Ada Korrin}</answer> The quick brown fox jumps over the lazy dog 0123456789."
)


def build_tiny_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_SAMPLE_TEXT] * 20, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 bos_token=None, unk_token=None)
    hf.add_tokens(token_tags())
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return hf


def build_tiny_model(tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


# ---------------------------------------------------------------- optional stacks

def _vllm_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed here: the vllm tests run in .venv-vllm (.ci/run, docs/engines.md)"
    return None


def _verl_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        return "verl is not installed here: the verl tests run in .venv-verl (.ci/run, docs/verl.md)"
    return None


def _trl_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return 'trl is not installed here: pip install -e ".[dev]" (or ".[trl]") installs it (docs/trl.md)'
    return None


# ---------------------------------------------------------------- RL: trajectories, a fake task, tiny steps

def make_traj(prompt, response, mask, rounds=(), traj_id=0, parent_id=None):
    return Trajectory(prompt_id="p", traj_id=traj_id, parent_id=parent_id, fork_token_index=None,
                      prompt_token_ids=list(prompt), response_token_ids=list(response), loss_mask=list(mask),
                      logprobs=[0.0] * len(response), entropies=[0.0] * len(response),
                      rounds=[Round(start=s, end=e, step_entropy=0.0) for s, e in rounds])


def _random_fixed(batch: Batch, seed: int = 0) -> FixedTensors:
    g = torch.Generator().manual_seed(seed)
    shape = batch.response_mask.shape
    return FixedTensors(old_log_probs=-torch.rand(shape, generator=g) * 3, old_entropy=torch.rand(shape, generator=g),
                        advantages=torch.randn(shape, generator=g))


class VaryingRewardTask:
    """``count`` questions; the reward depends on the response length, so groups get distinct scores."""

    name = "fake"

    def __init__(self, count: int = 6):
        self._examples = [Example(id=f"q{i}", question=f"question {i}", answers=["x"], data_source="fake",
                                  messages=[{"role": "user", "content": f"Velmora question {i}?"}])
                          for i in range(count)]

    def examples(self, split):
        return self._examples

    def tools(self):
        return {"search": EchoSearch()}

    def reward(self, example, response_text):
        return float(len(response_text) % 3) / 2

    def correct(self, example, response_text):
        return len(response_text) % 3 == 2

    def demonstrations(self):
        return []

    def texts(self):
        return []


TINY_RL = {"rollout.n": 2, "trainer.batch_size": 2, "trainer.mini_batch_size": 1, "trainer.micro_batch_size": 1,
           "trainer.steps": 2, "rollout.max_response_length": 24, "rollout.max_tokens_per_round": 8,
           "rollout.premonitor_probe_tokens": 4, "trainer.lr": 1e-2}


# ---------------------------------------------------------------- models

TEXTS = ["Velmora was founded in 1874 by Ada Korrin. <search>Velmora founder</search>",
         " <result>\nPage 1: Velmora\n</result> <python>print(2024 - 1874)</python> <answer>\\boxed{150}</answer>",
         ] + [f"city number {i} lies on the river Ostra near the hills of Kamet" for i in range(40)]


TINY = {"model.tiny_init": "random", "model.tiny_hidden_size": 32, "model.tiny_num_layers": 2,
        "model.tiny_intermediate_size": 64,
        "model.tiny_num_heads": 2, "model.tiny_num_kv_heads": 1, "model.tiny_head_dim": 16,
        "model.tiny_vocab_size": 400, "model.tiny_max_positions": 256, "model.tiny_copy_steps": 2}


class TextTask:
    def texts(self):
        return TEXTS


def tiny_cfg(cache_dir, **extra):
    return load_config(overrides={**TINY, "model.cache_dir": str(cache_dir), **extra})


# ---------------------------------------------------------------- SFT

PIECES = [("<think>find it</think> <search>Velmora founder</search>", True),
          (" <result>\nPage 1: Velmora was founded by Ada Korrin.\n</result>", False),
          (" <answer>\\boxed{Ada Korrin}</answer>", True)]


def demo(question: str = "Who founded Velmora?", pieces=PIECES) -> Demonstration:
    messages = [{"role": "system", "content": "Answer as <answer>\\boxed{x}</answer>."},
                {"role": "user", "content": question}]
    example = Example(id="q0", question=question, answers=["Ada Korrin"], data_source="synthetic", messages=messages)
    return Demonstration(example=example, pieces=list(pieces))


# ---------------------------------------------------------------- the whole job

TINY_PIPELINE = {
    "task.num_train": 8, "task.num_dev": 2, "task.num_test": 2, "task.num_demonstrations": 8,
    "model.tiny_init": "random", "model.tiny_hidden_size": 32, "model.tiny_num_layers": 1,
    "model.tiny_intermediate_size": 64,
    "model.tiny_vocab_size": 400, "model.tiny_num_heads": 2, "model.tiny_num_kv_heads": 1, "model.tiny_head_dim": 16,
    "model.tiny_copy_steps": 2, "sft.epochs": 1, "sft.batch_size": 8, "rollout.n": 2, "rollout.max_response_length": 32,
    "rollout.max_tokens_per_round": 12, "rollout.premonitor_probe_tokens": 4, "trainer.batch_size": 2,
    "trainer.mini_batch_size": 1, "trainer.micro_batch_size": 2, "trainer.steps": 2, "trainer.rollouts_to_save": 3,
    "eval.samples": 2, "trainer.run_name": "tiny",
}


# ---------------------------------------------------------------- the tree controller

def calls_then_answer(calls: int, entropy=1.0):
    """Rounds 0..calls-1 search (distinct queries), then answer."""
    def script(seq):
        h = entropy(seq) if callable(entropy) else entropy
        return (f"<search>q{seq.rounds}</search>" if seq.rounds < calls else "<answer>\\boxed{x}</answer>"), h
    return script


class ScriptedUniforms:
    """The draws U ~ Uniform(0, 1) of §1.4 from a fixed list, in place of the controller's seeded generator."""

    def __init__(self, draws):
        self.draws = iter(draws)

    def random(self) -> float:
        return next(self.draws)


def tree_cfg(**kw) -> RolloutConfig:
    base = dict(n=4, global_samples=1, entropy_segment="previous", max_response_length=512, call_limit=10)
    base.update(kw)
    return RolloutConfig(**base)


def tree_prompts(tok, k=1):
    return [(f"p{i}", tok.encode(f"question {i}", add_special_tokens=False)) for i in range(k)]


def tree_tools():
    return {"search": EchoSearch()}


# ---------------------------------------------------------------- the HF engine

class Recorder:
    """Drives an engine and remembers, per sequence, each generated position and its statistics."""

    def __init__(self, engine: HFEngine):
        self.engine = engine
        self.records: dict[int, list[tuple[int, int, float, float, float]]] = {}

    def add(self, ids):
        seq = self.engine.add_sequence(ids)
        self.records[seq] = []
        return seq

    def fork(self, seq):
        child = self.engine.fork(seq)
        self.records[child] = list(self.records[seq])
        return child

    def generate(self, seqs, budgets, params=SamplingParams()):
        starts = [len(self.engine.token_ids(s)) for s in seqs]
        segments = self.engine.generate(seqs, params, budgets)
        for seq, start, seg in zip(seqs, starts, segments):
            for k, tok in enumerate(seg.token_ids):
                self.records[seq].append((start + k, tok, seg.logprobs[k], seg.entropies[k], seg.top10_entropies[k]))
        return segments

    def max_error(self, model, seq) -> float:
        """Largest |engine − full forward| over log-probs, entropies and top-10 proxies of ``seq``."""
        ids = self.engine.token_ids(seq)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits, -1)
        entropy = -(logp.exp() * logp).sum(-1)
        top, top_ids = logp.topk(10, -1)
        top10 = -(top.exp() * top).sum(-1)
        worst = 0.0
        for pos, tok, lp, ent, t10 in self.records[seq]:
            assert ids[pos] == tok
            sampled = logp[pos - 1, tok]  # the release proxy adds the sampled token when outside the top 10
            expected = top10[pos - 1] + (0.0 if tok in top_ids[pos - 1] else -(sampled.exp() * sampled))
            worst = max(worst, abs(sampled.item() - lp), abs(entropy[pos - 1].item() - ent),
                        abs(float(expected) - t10))
        return worst


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


# ---------------------------------------------------------------- the OpenAI engine's fake server

TOP = {"token_id:1": -0.5, "token_id:2": -1.5, "token_id:3": -2.5}


class FakeServer:
    """A vLLM-like /v1/completions: replies with ``reply`` (truncated at a stop string or max_tokens)."""

    def __init__(self, tokenizer, reply: str, token_ids_in_output: bool = True, accepts_token_prompts: bool = True):
        self.tokenizer = tokenizer
        self.reply = tokenizer.encode(reply, add_special_tokens=False)
        self.token_ids_in_output = token_ids_in_output
        self.accepts_token_prompts = accepts_token_prompts
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        body = json.loads(request.content)
        self.bodies.append(body)
        if isinstance(body["prompt"], list) and not self.accepts_token_prompts:
            return httpx.Response(400, json={"error": "prompt must be a string"})
        tokens, finish, stop_reason = self.reply[:body["max_tokens"]], "length", None
        for k in range(1, len(tokens) + 1):
            hit = next((s for s in body.get("stop", []) if s in self.tokenizer.decode(tokens[:k])), None)
            if hit is not None:
                tokens, finish, stop_reason = tokens[:k], "stop", hit
                break
        if finish == "length" and len(tokens) < body["max_tokens"]:
            finish = "stop"  # the reply ended: EOS
        names = [f"token_id:{t}" if self.token_ids_in_output else self.tokenizer.decode([t]) for t in tokens]
        choice = {"index": 0, "text": self.tokenizer.decode(tokens), "finish_reason": finish,
                  "stop_reason": stop_reason,
                  "logprobs": {"tokens": names, "token_logprobs": [-0.25 * (i + 1) for i in range(len(tokens))],
                               "top_logprobs": [dict(TOP) for _ in tokens]}}
        prompt_tokens = len(body["prompt"]) if isinstance(body["prompt"], list) else 7
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                 "prompt_tokens_details": {"cached_tokens": 2}}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})


def make_engine(tokenizer, server, **kwargs):
    client = httpx.Client(transport=httpx.MockTransport(server))
    return OpenAIEngine("http://fake:8000/v1/", "policy", tokenizer, http_client=client, **kwargs)


# ---------------------------------------------------------------- vLLM

def build_qwen3(tokenizer, seed: int = 0):
    """A tiny random Qwen3 that vLLM's CPU backend runs (head_dim 32); peaky enough for stable argmaxes."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, initializer_range=0.2,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


# ---------------------------------------------------------------- the tiny model steered to call tools

class SteeredQwen3(Qwen3ForCausalLM):
    def forward(self, input_ids=None, cache=None, logits_to_keep=0, **kwargs):
        out = super().forward(input_ids=input_ids, cache=cache, logits_to_keep=logits_to_keep, **kwargs)
        k = out.logits.shape[1]
        out.logits = out.logits + self.steering[input_ids[:, -k:]]
        return out


def steer(model, tok) -> SteeredQwen3:
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<search>", "</search>", "<answer>", "</answer>",
                                                      "</think>", "</result>", "<result>")}
    vocab = model.config.vocab_size
    tags = [tok.convert_tokens_to_ids(t) for t in tok.get_added_vocab()] + [tok.eos_token_id]
    bias = torch.zeros(vocab, vocab)
    bias[:, ids["</search>"]] = 2.5
    bias[:, ids["</answer>"]] = 1.0
    bias[:, ids["<result>"]] = -1e4                     # the model never writes results
    for opener in ("</think>", "</result>"):
        bias[ids[opener]] = -1e4
        bias[ids[opener], ids["<search>"]] = 30.0
        bias[ids[opener], ids["<answer>"]] = 28.6       # ≈ 20 % answers straight away
    for opened in ("<search>", "<answer>"):
        bias[ids[opened], tags] = -1e4                  # a body comes first
    steered = SteeredQwen3(model.config)
    steered.load_state_dict(model.state_dict())
    steered.register_buffer("steering", bias, persistent=False)
    return steered.eval()


def _prompts(tok, k):
    out = []
    for i in range(k):
        ids = tok.apply_chat_template([{"role": "user", "content": f"who founded Velmora {i}?"}],
                                      add_generation_prompt=True, tokenize=True)["input_ids"]
        out.append((f"q{i}", list(ids) + [tok.convert_tokens_to_ids("<think>"), 60 + i,
                                          tok.convert_tokens_to_ids("</think>")]))
    return out


CFG = dict(n=4, max_response_length=64, max_tokens_per_round=16, max_tool_response_tokens=6, call_limit=3,
           premonitor_probe_tokens=8)


# ---------------------------------------------------------------- static decoding

def script(engine: HFEngine, tok, params: SamplingParams):
    """Tool rounds, forks before and after generation and after a tool result, ragged budgets, a
    stop string, a fresh prompt next to cached rows, a context past one column bucket. Returns the
    Recorder and every segment in call order."""
    rec, segments = Recorder(engine), []
    a = rec.add(encode(tok, "<think>I need to find who founded Velmora.</think>"))
    b = rec.add(encode(tok, "The quick"))
    a_early = rec.fork(a)
    segments += rec.generate([a, b, a_early], [7, 12, 4], params)
    engine.append(a, encode(tok, " <result>\nPage 1: Velmora was founded in 1874.\n</result>"))
    c, b_mid = rec.fork(a), rec.fork(b)
    segments += rec.generate([c, b, a, b_mid], [5, 3, 9, 6], params)
    engine.append(c, encode(tok, " <result>\n150\n</result>") * 60)  # past COLUMN_BUCKET columns
    engine.append(a_early, encode(tok, " <python>print(1)</python>"))
    d = rec.fork(c)
    late = rec.add(encode(tok, "Ada"))
    segments += rec.generate([d, a_early, late, c, b], [8, 5, 6, 2, 11], params)
    many = [rec.fork(late) for _ in range(5)]  # 6 rows, then 1: the batch shrinks to a smaller bucket
    segments += rec.generate([late, *many], [12, 1, 2, 1, 3, 1], params)
    return rec, segments


# ---------------------------------------------------------------- PhantomWiki

HAVE_GENERATOR = shutil.which("swipl") is not None and importlib.util.find_spec("phantom_wiki") is not None


needs_generator = pytest.mark.skipif(not HAVE_GENERATOR, reason="needs SWI-Prolog and phantom-wiki: " + INSTALL)


TINY_UNIVERSES = {"task.name": "phantomwiki", "task.phantomwiki_num_trees": 2, "task.phantomwiki_tree_size": 12,
                  "task.phantomwiki_questions_per_template": 1, "task.phantomwiki_train_questions_per_template": 3,
                  "task.search_topk": 3, "task.search_max_chars": 400}


def frozen_study(tmp_path: Path, files: dict[str, str]) -> tuple[Path, str, Path, Path]:
    """A study runner's world: a frozen checkout (a one-commit git repository of ``files``), its commit, and a
    PYTHON that records each `-m aepo_rl ARGS` as one line of the calls file and runs anything else with this
    Python. Returns ``(src, commit, python, calls)``."""
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "frozen"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nif [[ $1 == -m && $2 == aepo_rl ]]; then shift 2; '
                    f'echo "$*" >> {calls}; exit 0; fi\n'
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    return src, commit, fake, calls


# The search tool's hand corpus: each query's one relevant page (tests/test_search.py, test_search_server.py).
HAND_CORPUS = [
    {"id": "volcano", "title": "Mount Vesuvius",
     "text": "A volcano near Naples whose eruption in 79 AD buried Pompeii."},
    {"id": "violin", "title": "Stradivarius",
     "text": "Violins crafted by Antonio Stradivari in Cremona are prized by musicians."},
    {"id": "glacier", "title": "Perito Moreno Glacier", "text": "An advancing glacier of ice in Patagonia, Argentina."},
    {"id": "chess", "title": "Queen's Gambit", "text": "A chess opening in which White offers a pawn sacrifice."},
    {"id": "coffee", "title": "Espresso", "text": "Coffee brewed by forcing hot water through finely ground beans."},
    {"id": "rocket", "title": "Saturn V", "text": "The rocket that launched the Apollo missions to the Moon."},
    {"id": "tulip", "title": "Tulip mania", "text": "A speculative bubble in Dutch tulip bulb prices in the 1630s."},
    {"id": "whale", "title": "Blue whale", "text": "The largest animal ever known, a marine mammal feeding on krill."},
]
HAND_QUERIES = {
    "volcano that buried Pompeii": "volcano", "violin maker from Cremona": "violin",
    "glaciers in Patagonia": "glacier", "chess opening pawn sacrifice": "chess",
    "how is espresso coffee brewed": "coffee", "rocket of the Apollo moon missions": "rocket",
    "Dutch tulip bubble": "tulip", "largest animal eating krill": "whale",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
