# Sourced by the GPU scripts (gpu_check.sh, gpu_vllm_check.sh): install the wheels of .whl/ (the project's
# dependencies the GPU image lacks, lab/gpu/gpu_wheels.sh) into /tmp/aepo-site and put it and the
# repository on PYTHONPATH. Expects to be sourced from the repository root with $OUT set.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/aepo-site \
        .whl/*.whl || { echo "installing .whl/ failed" | tee "$OUT/gpu.txt"; exit 1; }
    export PYTHONPATH="/tmp/aepo-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
