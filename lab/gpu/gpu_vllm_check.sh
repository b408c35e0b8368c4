#!/usr/bin/env bash
# Call 2 of the GPU run (docs/gpu.md#the-plan-of-calls), after lab/gpu/gpu_stash.sh: check the parts of the vLLM
# bundle (lab/gpu/gpu_bundle.sh) against their sums, join and install them into /tmp/aepo-vllm, import vLLM,
# then run the vLLM probe (lab/gpu/gpu_vllm_probe.py) and two RL steps of a random Qwen3-0.6B with vLLM rollouts.
# Without a complete, intact set of parts it says so and stops (the HF engine was measured in call 1).
#
#     OUT=/some/folder bash lab/gpu/gpu_vllm_check.sh
#
# Writes into $OUT: vllm.txt (install and import lines), vllm_probe.jsonl, vllm_train.log, vllm_metrics.jsonl.
# Dry run on the CPU (the plumbing: sums, join, install, imports, the probe on the tiny model; no training):
#     SCRATCH=/tmp/x PROBE_ARGS="--device cpu --shape tiny --dtype float32 --rows 4 --new-tokens 8" TRAIN=0 bash ...
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/aepo-gpu-check}"
parts="${SCRATCH:-/tmp}/aepo-parts"
mkdir -p "$OUT"
source lab/gpu/gpu_env.sh
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
start=$SECONDS
if (cd "$parts" 2>/dev/null && sha256sum -c --quiet SHA256SUMS); then
    mkdir -p /tmp/aepo-bundle && cat "$parts"/p? | tar -xf - -C /tmp/aepo-bundle \
        && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/aepo-vllm \
            /tmp/aepo-bundle/*.whl \
        && export PYTHONPATH="/tmp/aepo-vllm:$PYTHONPATH" && vllm=1 || vllm=0
else
    echo "parts missing or corrupt in $parts: vLLM stays unverified" ; vllm=0
fi
echo "install: vllm=$vllm in $((SECONDS - start)) s" | tee "$OUT/vllm.txt"
if [ "$vllm" = 1 ]; then
    timeout 90 python3 lab/gpu/gpu_vllm_imports.py 2>&1 | tail -12 | tee -a "$OUT/vllm.txt"
    echo "== vLLM probe"
    timeout 300 python3 lab/gpu/gpu_vllm_probe.py ${PROBE_ARGS:-} --out "$OUT/vllm_probe.jsonl" 2>&1 | grep '^{' | cut -c1-400
    [ "${TRAIN:-1}" = 1 ] || exit 0
    echo "== two RL steps with vLLM rollouts"
    rm -rf /tmp/aepo-vllm-runs
    timeout 150 python3 -m aepo_rl train model.init=random:qwen3-0.6b model.dtype=bfloat16 \
        model.gradient_checkpointing=true trainer.device=cuda sft.epochs=0 trainer.steps=2 eval.num_questions=16 \
        rollout.engine=vllm rollout.entropy_measure=surprisal \
        "rollout.vllm_compilation_config={mode: 0, cudagraph_mode: FULL_DECODE_ONLY}" \
        trainer.run_dir=/tmp/aepo-vllm-runs trainer.run_name=vllm >"$OUT/vllm_train.log" 2>&1
    echo "train exit $?"; tail -3 "$OUT/vllm_train.log" | cut -c1-300
    cp /tmp/aepo-vllm-runs/vllm/metrics.jsonl "$OUT/vllm_metrics.jsonl" 2>/dev/null
fi
