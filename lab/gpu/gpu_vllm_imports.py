"""Import the vLLM modules that VLLMEngine reaches (engine, worker, the Qwen3 and Llama models, the FlashAttention
backend, the sampler), each on its own; sort the failures: a missing Python package (ModuleNotFoundError: carry it
in lab/gpu/gpu_bundle.sh) or a compiled part that needs CUDA (expected off the GPU machine). Exit status 1 when a
Python package is missing. Run by ``CHECK=1 bash lab/gpu/gpu_bundle.sh`` and on the GPU machine before the probe."""

from __future__ import annotations

import importlib
import os
import sys

MODULES = ("vllm", "vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.worker.gpu_model_runner",
           "vllm.model_executor.models.qwen3", "vllm.model_executor.models.llama",
           "vllm.v1.attention.backends.flash_attn", "vllm.v1.sample.sampler", "vllm.device_allocator.cumem",
           "vllm.inputs")


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    missing: dict[str, str] = {}
    for module in MODULES:
        try:
            importlib.import_module(module)
            print(f"ok       {module}")
        except ModuleNotFoundError as error:
            if error.name and not error.name.startswith("vllm"):
                missing[error.name.split(".")[0]] = module
                print(f"MISSING  {module}: no module {error.name!r}")
            else:
                print(f"compiled {module}: {error}"[:200])
        except Exception as error:  # a CUDA library, a kernel .so: expected on a CPU machine
            print(f"other    {module}: {type(error).__name__}: {error}"[:200])
    if missing:
        print(f"missing Python packages: {', '.join(sorted(missing))}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
