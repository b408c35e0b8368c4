"""Atomic checkpoints and exact resume.

Every file is written to a temporary name in its destination folder and moved into place with
``os.replace``; a checkpoint folder is assembled under a temporary name and renamed when
complete, so ``checkpoints/step_<k>/`` exists only if step k was saved in full. A ``kill -9``
at any moment therefore loses at most the step in flight.

A checkpoint holds the policy as a standard Hugging Face folder (``model/``) and
``trainer_state.pt``: optimizer, lr scheduler, step, data order, rollout state, the RNG states
(python, numpy, torch, the engine's generator) and the metrics of every step so far.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import yaml

from aepo_rl.errors import disk_full_as_oserror
from aepo_rl.models import ModelPathError, save_policy

STEP_DIR = re.compile(r"^step_(\d+)$")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rng_state(engine=None) -> dict:
    """Python, numpy, torch and (when it has one) the engine's torch generator state."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    generator = getattr(engine, "generator", None)
    if isinstance(generator, torch.Generator):
        state["engine"] = generator.get_state()
    return state


def set_rng_state(state: dict, engine=None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator = getattr(engine, "generator", None)
    if "engine" in state and isinstance(generator, torch.Generator):
        generator.set_state(state["engine"])


def step_dirs(checkpoint_dir: str | Path) -> list[Path]:
    """Complete step checkpoints, oldest first."""
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    dirs = step_dirs(checkpoint_dir)
    return dirs[-1] if dirs else None


def find_trained_model(run_dir: str | Path, task_name: str) -> Path | None:
    """The model of the newest run folder under ``run_dir`` trained on ``task_name`` (its config.yaml says so):
    its newest step checkpoint's model, else its SFT model; None when there is none."""
    runs = [config.parent for config in Path(run_dir).expanduser().glob("*/config.yaml")]
    for run in sorted(runs, key=lambda folder: folder.stat().st_mtime, reverse=True):
        try:
            task = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("task", {}).get("name")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if task != task_name:
            continue
        latest = latest_checkpoint(run / "checkpoints")
        for model in ([latest / "model"] if latest else []) + [run / "checkpoints" / "sft"]:
            if (model / "config.json").is_file():
                return model
    return None


def save_checkpoint(checkpoint_dir: str | Path, step: int, model, tokenizer, state: dict, *, keep: int) -> Path:
    """Write ``checkpoints/step_<step>/`` atomically and keep only the newest ``keep`` step checkpoints."""
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=checkpoint_dir, prefix=f".tmp-step_{step:06d}-"))
    try:
        save_policy(model, tokenizer, tmp / "model")
        with disk_full_as_oserror(final):
            torch.save(state, tmp / "trainer_state.pt")
        if final.exists():  # re-saving a step (e.g. the final save right after a periodic one)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in step_dirs(checkpoint_dir)[:-keep]:
        shutil.rmtree(old)
    return final


def load_trainer_state(checkpoint: str | Path) -> dict:
    """The ``trainer_state.pt`` of a checkpoint (our own file, so full unpickling is safe), its tensors on
    the CPU whatever device saved them: the optimizer and LoRA restore move them to the policy's device.

    Checkpoints written before the trainer owned its rollout state kept the release-quirk
    baselines (§1.4) at the top level as ``slot_baselines``; they are moved to where the trainer
    reads them now.
    """
    path = Path(checkpoint) / "trainer_state.pt"
    try:
        state = torch.load(path, weights_only=False, map_location="cpu")
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:  # what torch raises for a cut or corrupt file
        raise ModelPathError(f"{path}: the checkpoint's trainer state is truncated or damaged ({type(err).__name__}: "
                             f"{err}); delete {Path(checkpoint)} to resume from the checkpoint before it") from err
    if "slot_baselines" in state:
        state["trainer"].setdefault("rollout", {"slot_baselines": state.pop("slot_baselines")})
    return state


def remove_partial_checkpoints(checkpoint_dir: str | Path) -> None:
    """Delete temporary folders left by a run killed while saving."""
    folder = Path(checkpoint_dir)
    if folder.is_dir():
        for leftover in folder.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
