#!/usr/bin/env bash
# The vLLM bundle for the GPU machine (docs/gpu.md#vllm-on-the-gpu-machine): vLLM 0.26.0, the newest release
# built on the image's torch 2.11 (CUDA 13), trimmed of what a dense bf16 model on Hopper never loads, with
# the Python packages it needs that the GPU image lacks, packed in one tar split into parts of at most
# 58 MiB (.xfer/p0, .xfer/p1, ...) and .xfer/SHA256SUMS. Runs where pip reaches PyPI (not on the GPU
# machine); .xfer/ is ignored by git. CHECK=1 then installs the bundle into a throwaway CPU venv that
# holds what the image holds (torch 2.13.0+cpu in place of 2.11.0+cu130) and imports the modules
# VLLMEngine reaches: a ModuleNotFoundError names a package to add. Prints a few lines per step.
#
#     bash lab/gpu/gpu_bundle.sh               # ~400 MB of downloads, 1-3 minutes
#     CHECK=1 bash lab/gpu/gpu_bundle.sh       # and the import check (more minutes)
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK="${WORK:-/tmp/aepo-bundle}"
VLLM="vllm==0.26.0"
rm -rf "$WORK" .xfer
mkdir -p "$WORK/wheels" .xfer
platforms=(--only-binary=:all: --python-version 3.12 --implementation cp --platform linux_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for n in $(seq 5 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done

echo "== 1/4 resolve $VLLM for CPython 3.12 on x86-64 (metadata only)"
python3 -m pip install -q --dry-run --ignore-installed --target "$WORK/none" --report "$WORK/report.json" \
    "${platforms[@]}" "$VLLM" 2> >(grep -v "^WARNING: Location" >&2)

echo "== 2/4 download what the GPU image lacks"
python3 - "$WORK/report.json" "$WORK" <<'EOF'
import json, re, sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

# The GPU image's packages (device notes, read on 2026-11-17): carried only if missing.
IMAGE = set(map(norm, """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp""".split()))
# Not loaded for a dense bf16 model on Hopper through vllm.LLM (design note §1), or compiled CUDA extras:
# left behind. Prefixes end with "-".
# (llguidance, xgrammar and its apache-tvm-ffi are carried: vllm.entrypoints.llm imports them.)
LEFT = tuple(map(norm, """torch- torchcodec triton tokenspeed- nvidia- cuda- flashinfer-python quack-kernels
humming-kernels tilelang pynvvideocodec fastsafetensors z3-solver outlines-core kernels nvtx anthropic mcp sentry-sdk
supervisor opentelemetry- fastapi-cli fastapi-cloud-cli rignore fastar truststore cryptography cffi pycparser pyjwt
model-hosting-container-standards""".split()))
report = json.load(open(sys.argv[1]))
carry, image = [], []
for item in report["install"]:
    meta = item["metadata"]
    name = norm(meta["name"])
    pin = f"{meta['name']}=={meta['version']}"
    if name in IMAGE:
        image.append(pin)
    elif not any(name == left or (left.endswith("-") and name.startswith(left)) for left in LEFT):
        carry.append(pin)
open(f"{sys.argv[2]}/carry.txt", "w").write("\n".join(carry) + "\n")
open(f"{sys.argv[2]}/image.txt", "w").write("\n".join(image) + "\n")
print(f"{len(report['install'])} resolved: {len(carry)} carried, {len(image)} in the image, "
      f"{len(report['install']) - len(carry) - len(image)} left behind")
EOF
python3 -m pip download -q --no-deps "${platforms[@]}" -d "$WORK/wheels" -r "$WORK/carry.txt" \
    2> >(grep -v "^WARNING: Location" >&2)

echo "== 3/4 trim vllm: FA2 (not used on sm90), MoE kernels, the Rust frontend, JIT headers, other Pythons' .so"
wheel=$(ls "$WORK"/wheels/vllm-0.26.0-*.whl)
before=$(stat -c %s "$wheel")
zip -q -d "$wheel" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs' \
    'vllm/third_party/deep_gemm/include/*' 'vllm/third_party/deep_gemm/_C.cpython-310-*' \
    'vllm/third_party/deep_gemm/_C.cpython-311-*' 'vllm/third_party/deep_gemm/_C.cpython-313-*' \
    'vllm/third_party/deep_gemm/_C.cpython-314-*' \
    'vllm/third_party/fmha_sm100/*.h' 'vllm/third_party/fmha_sm100/*.hpp' 'vllm/third_party/fmha_sm100/*.cuh' \
    'vllm/third_party/fmha_sm100/*.cu' 'vllm/third_party/fmha_sm100/*.inl' >/dev/null
record=vllm-0.26.0.dist-info/RECORD  # drop the deleted files' lines, so pip installs the wheel as it is
mkdir -p "$WORK/record/${record%/*}"
unzip -Z1 "$wheel" | sort >"$WORK/kept.txt"
unzip -p "$wheel" "$record" | python3 -c "
import sys
kept = set(open('$WORK/kept.txt').read().split())
sys.stdout.write(''.join(line for line in sys.stdin if line.split(',')[0] in kept))" >"$WORK/record/$record"
(cd "$WORK/record" && zip -q "$wheel" "$record")
echo "vllm wheel $((before / 1000000)) MB -> $(($(stat -c %s "$wheel") / 1000000)) MB"

echo "== 4/4 pack: tar, parts of 58 MiB, sha256 sums"
tar -cf - -C "$WORK/wheels" . | split -b 58m -d -a 1 - .xfer/p
(cd .xfer && sha256sum p? >SHA256SUMS)
ls -l .xfer | tail -n +2
echo "bundle: $(ls "$WORK"/wheels | wc -l) wheels, $(du -sh .xfer | cut -f1) in .xfer/"

if [ "${CHECK:-0}" = 1 ]; then
    # This machine's python3 and torch 2.13.0+cpu stand in for the image's Python 3.12 and torch 2.11.0+cu130: the
    # carried and the image's packages at the same versions, built for this Python; vllm itself is the trimmed
    # abi3 wheel of the bundle.
    echo "== import check in a throwaway CPU venv ($(python3 -V), torch 2.13.0+cpu)"
    python3 -m venv "$WORK/venv"
    py="$WORK/venv/bin/python"
    quiet() { "$@" 2> >(grep -v "^WARNING: Location" >&2); }
    quiet "$py" -m pip install -q torch==2.13.0
    # the image's own versions where the device notes give them
    grep -v -i -E "^(torch|triton|torchvision|torchaudio|nvidia-|cuda-|transformers|huggingface.hub|tokenizers)=" \
        "$WORK/image.txt" >"$WORK/image-cpu.txt"
    printf '%s\n' transformers==5.17.0 huggingface_hub==1.33.0 tokenizers==0.23.2 >>"$WORK/image-cpu.txt"
    grep -v "^vllm==" "$WORK/carry.txt" >>"$WORK/image-cpu.txt"
    quiet "$py" -m pip install -q --no-deps -r "$WORK/image-cpu.txt"
    quiet "$py" -m pip install -q --no-deps "$wheel"
    PYTHONPATH="$PWD" "$py" lab/gpu/gpu_vllm_imports.py
fi
