#!/usr/bin/env bash
# The comparison of lab/notebook.md: every preset and the paper's ablations on the synthetic task,
# from one shared SFT model, 5 seeds for grpo/arpo/aepo and 3 for the rest, 80 RL steps each
# (45 runs; hours of 2-core compute). Interrupted? Run it again: finished runs are kept and the
# run in flight resumes from its checkpoint. Add --table-only to tabulate what has finished.
set -euo pipefail
out=${1:-runs/compare-all}
shift || true
aepo compare \
  --presets grpo:5,arpo:5,aepo:5,reinforce_plus_plus,dapo,gppo,cispo,gigpo,official,aepo_no_premonitor,aepo_no_branch_penalty,aepo_no_sg_clip,aepo_no_entropy_adv \
  --seeds 3 --out "$out" "$@"
