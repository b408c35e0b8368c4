#!/usr/bin/env bash
# Fill .whl/ with the wheels lab/gpu/gpu_check.sh installs on a GPU machine whose image has torch,
# transformers, numpy, scipy, PyYAML, rich, httpx, matplotlib, pyarrow, tensorboard, peft and pytest
# but none of the packages below, and no network. Runs where pip reaches PyPI; the wheels are for
# CPython 3.12 on x86-64 Linux. .whl/ is ignored by git (.git/info/exclude or .gitignore).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl \
    "bm25s==0.3.16" "PyStemmer==3.1.0" "math-verify==0.9.0" "latex2sympy2_extended==1.11.0" \
    "antlr4-python3-runtime==4.13.2"
ls -l .whl
du -sh .whl
