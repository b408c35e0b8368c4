"""Hugging Face model folders: devices and dtypes, checking a folder (with the fix when it is not one),
loading, saving atomically, random weights of a registered architecture, gradient checkpointing."""

from __future__ import annotations

import copy
import difflib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from aepo_rl.config import ConfigError
from aepo_rl.errors import UserError, disk_full_as_oserror
from aepo_rl.models.lora import is_peft
from aepo_rl.registry import ARCHITECTURES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""A model folder holds its tokenizer when it has one of these (fast, SentencePiece, BPE or WordPiece)."""


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


def enable_gradient_checkpointing(model) -> None:
    """transformers' gradient checkpointing of every decoder layer, non-reentrant (so LoRA needs no
    input-gradient hook). transformers 5 calls it activation checkpointing and deprecates the old name."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def init_random_model(name: str, tokenizer, dtype: torch.dtype = torch.float32,
                      device: torch.device | str = "cpu", seed: int = 0):
    """A randomly initialised model of the registered architecture ``name`` (``model.init=random:<name>``,
    :data:`aepo_rl.registry.ARCHITECTURES`), its vocabulary sized to ``tokenizer``.

    The weights are created directly on ``device`` in ``dtype`` (seed ``seed``): an 8B shape in
    bf16 on a GPU never exists as fp32 weights on the CPU. ``device="meta"`` gives the shape without
    any memory (parameter counts, memory estimates).
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

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
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return ""
    names = sorted(entry.name for entry in parent.iterdir() if entry.is_dir())
    part = folder.relative_to(parent).parts[0] if folder.is_relative_to(parent) else folder.name
    close = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
    return (f" ({parent} exists but has no {part!r}"
            + (f"; did you mean {', '.join(repr(str(parent / n)) for n in close)}?" if close else "") + ")")


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


def load_hf_dir(folder: str | Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # transformers' per-shard bars would clutter the run's rich console
    tokenizer = load_tokenizer(folder)
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


def load_tokenizer(folder: str | Path):
    """The tokenizer of an HF folder; padding with EOS when it has no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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
