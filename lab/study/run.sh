#!/usr/bin/env bash
# The pre-registered multi-hop study (lab/study/preregistration.md, lab/study/README.md): one command per
# phase, each resumable (run the same command again to continue an interrupted phase).
#
#   lab/study/run.sh phase0            SFT model with the gate's settings, K = 8 evaluation, gate.json
#   lab/study/run.sh phase1            optimizer calibration on GRPO (seed 100), AEPO mechanism check
#   lab/study/run.sh register COMMIT   record the commit of lab/study/preregistration.md (phases 2-3 need it)
#   lab/study/run.sh phase2            grpo, arpo, aepo x 8 seeds (two processes side by side)
#   lab/study/run.sh phase3            gppo, aepo_no_sg_clip, aepo_no_branch_penalty, arpo_random x 5
#   lab/study/run.sh tables            `aepo compare --table-only` over every arm (references aepo, arpo, grpo),
#                                      then every hypothesis's verdict (study_rules.py verdicts)
#   lab/study/run.sh replicate         exploratory: grpo, arpo, aepo x 4 seeds in a second world (task seed 1)
#   lab/study/run.sh replicate-tables  the replication's tables and the same verdict code, labelled exploratory
#   lab/study/run.sh stop              SIGTERM to this study's running aepo processes (each saves its step)
#
# Variables: SRC (the frozen checkout the study runs) and STUDY (its output folder), both required; PYTHON
# (default python), POLL (default 20 s). Every process runs one thread.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SRC=$(cd "${SRC:?set SRC to the frozen checkout the study runs}" && pwd)
STUDY=${STUDY:?set STUDY to the study output folder}
PYTHON=${PYTHON:-python}
POLL=${POLL:-20}  # seconds between checks of the other worker's marker
mkdir -p "$STUDY/logs"
STUDY=$(cd "$STUDY" && pwd)
export PYTHONPATH="$SRC" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# The task and model of the gate's configuration G4 (lab/study/preregistration.md, "Deviations"): 3 hops, a
# 384-token response budget, 3-layer tiny model, teacher errors in a quarter of the demonstrations.
TASK="task.max_hops=3 rollout.max_response_length=384 sft.max_length=768 model.tiny_num_layers=3 task.teacher_error_rate=0.25"
SFT_MODEL="$STUDY/phase0/checkpoints/sft"
# Every RL run: the phase-0 model, no further SFT, batch 8 prompts x n = 8, sampling temperature 0.9.
RL="$TASK model.path=$SFT_MODEL sft.epochs=0 trainer.batch_size=8 rollout.n=8 rollout.temperature=0.9"
# Phase-1 candidates, in the order they are tried (lab/study/preregistration.md): 8 optimizer steps per RL step each.
CANDIDATES=(
  "C1:trainer.mini_batch_size=1 trainer.ppo_epochs=1 trainer.lr=1e-4"
  "C2:trainer.mini_batch_size=1 trainer.ppo_epochs=1 trainer.lr=5e-5"
  "C3:trainer.mini_batch_size=2 trainer.ppo_epochs=2 trainer.lr=1e-4"
  "C4:trainer.mini_batch_size=4 trainer.ppo_epochs=4 trainer.lr=5e-5"
)
# Pre-declared extension, tried in this order only when none of C1-C4 meets the rule (a deviation from the
# design's list, recorded in decision.json): C1 clipped 0.09% of tokens (steps 6-20), a tenth of the rule's
# lower bound, so a larger step size at the release's 8 optimizer steps comes first, then more staleness.
EXTENSION=(
  "C5:trainer.mini_batch_size=1 trainer.ppo_epochs=1 trainer.lr=3e-4"
  "C6:trainer.mini_batch_size=1 trainer.ppo_epochs=1 trainer.lr=1e-3"
  "C7:trainer.mini_batch_size=1 trainer.ppo_epochs=2 trainer.lr=3e-4"
  "C8:trainer.mini_batch_size=1 trainer.ppo_epochs=4 trainer.lr=3e-4"
)
CALIBRATION="trainer.steps=20 trainer.seed=100 rollout.seed=100 eval.num_questions=16 eval.samples=1"
STEPS=100
COMPARE="$STUDY/compare"
PHASE2_ARMS="grpo:8,arpo:8,aepo:8"
PHASE3_ARMS="gppo:5,aepo_no_sg_clip:5,aepo_no_branch_penalty:5,arpo_random:5"
# The exploratory replication (lab/study/preregistration.md, section 6): the same runs in a second world.
REPLICATE="$STUDY/replicate"
REPLICATE_WORLD="task.seed=1"
REPLICATE_ARMS="grpo:4,arpo:4,aepo:4"

say() { echo "[$(date -u +%FT%TZ)] $*" | tee -a "$STUDY/logs/run.log" >&2; }
die() { say "ERROR: $*"; exit 1; }

# One `python -m aepo_rl` of the frozen checkout, in the background, its pid recorded for `run.sh stop`.
aepo() {  # aepo LOG ARGS...
  local log=$1; shift
  echo "[$(date -u +%FT%TZ)] aepo $*" >> "$log"
  (cd "$SRC" && exec "$PYTHON" -m aepo_rl "$@") >> "$log" 2>&1 &
  local pid=$!
  echo "$pid" >> "$STUDY/logs/pids"
  wait "$pid"
}

check_frozen() {  # the checkout is clean and the commit every earlier phase ran
  [[ -z $(git -C "$SRC" status --porcelain --untracked-files=no) ]] || die "$SRC has local changes: the study runs one frozen commit"
  local commit; commit=$(git -C "$SRC" rev-parse HEAD)
  if [[ -f $STUDY/commit.txt ]]; then
    [[ $(cat "$STUDY/commit.txt") == "$commit" ]] || die "$SRC is at $commit, the study at $(cat "$STUDY/commit.txt")"
  else
    echo "$commit" > "$STUDY/commit.txt"
  fi
}

lock_phase() {  # one runner per phase at a time
  exec 9> "$STUDY/logs/$1.lock"
  flock -n 9 || die "$1 is already running (lock $STUDY/logs/$1.lock)"
}

json_get() { "$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

phase0() {
  local dir="$STUDY/phase0" log="$STUDY/logs/phase0.log"
  mkdir -p "$dir"
  # the post-SFT evaluation is trimmed (16 questions, 1 sample): the K = 8 evaluation below replaces it
  [[ -f $dir/sft_metrics.json && -d $SFT_MODEL ]] ||
    aepo "$log" sft --out "$dir" $TASK eval.num_questions=16 eval.samples=1
  [[ -f $dir/eval8.json ]] ||
    aepo "$log" eval --model "$SFT_MODEL" --samples 8 --out "$dir/eval8.json" $TASK
  "$PYTHON" "$HERE/study_rules.py" gate "$dir/eval8.json" "$dir/gate.json" || die "phase 0: the gate is not cleared ($dir/gate.json)"
  say "phase 0 done: gate cleared ($dir/gate.json)"
}

train_run() {  # train_run NAME PRESET OVERRIDES...: a 20-step calibration run, continued when started
  local name=$1 preset=$2; shift 2
  local run="$STUDY/phase1/$name" log="$STUDY/logs/phase1-$name.log"
  if [[ -f $run/eval.json ]] && "$PYTHON" -c "import json,sys; sys.exit(0 if 'rl' in json.load(open(sys.argv[1])) else 1)" "$run/eval.json"; then
    return 0
  elif [[ -f $run/config.yaml ]] && [[ -e $run/metrics.jsonl || -e $run/checkpoints || -e $run/eval.json ]]; then
    aepo "$log" train --resume "$run"
  else
    aepo "$log" train --preset "$preset" $RL $CALIBRATION "$@" trainer.run_dir="$STUDY/phase1" trainer.run_name="$name"
  fi
}

phase1() {
  local dir="$STUDY/phase1"
  [[ $(json_get "$STUDY/phase0/gate.json" clears 2>/dev/null) == True ]] || die "phase 1 needs a cleared gate: run phase0 first"
  mkdir -p "$dir"
  local chosen="" spec id settings
  for spec in "${CANDIDATES[@]}" "${EXTENSION[@]}"; do
    id=${spec%%:*}; settings=${spec#*:}
    train_run "$id-grpo" grpo $settings
    if "$PYTHON" "$HERE/study_rules.py" calibration "$dir/$id-grpo" "$dir/$id-grpo/rule.json"; then
      chosen=$id; break
    fi
  done
  if [[ -z $chosen ]]; then
    "$PYTHON" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
json.dump({"chosen": None, "reason": "no candidate (C1-C8) met the calibration rule"}, open(f"{d}/decision.json", "w"), indent=2)
PY
    die "phase 1: no candidate met the rule ($dir/decision.json)"
  fi
  # the mechanism check reads only actor/grad_preserved_frac; the run's log and eval.json hold scores nobody reads
  train_run "$chosen-aepo" aepo $settings
  local preserved=0
  "$PYTHON" "$HERE/study_rules.py" preserved "$dir/$chosen-aepo" "$dir/$chosen-aepo/rule.json" || preserved=$?
  "$PYTHON" - "$dir" "$chosen" "$settings" "$preserved" "$(cat "$STUDY/commit.txt")" <<'PY'
import json, sys
from pathlib import Path
d, chosen, settings, preserved, commit = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "0", sys.argv[5]
tried = sorted(p.parent.name for p in d.glob("C*-grpo/rule.json"))
decision = {"commit": commit, "chosen": chosen if preserved else None, "candidate": chosen, "overrides": settings,
            "extension": int(chosen[1:]) > 4,  # C5-C8: the pre-declared extension beyond the design's C1-C4
            "calibration": {name: json.loads((d / name / "rule.json").read_text()) for name in tried},
            "aepo_check": json.loads((d / f"{chosen}-aepo" / "rule.json").read_text()),
            "decided": "first candidate meeting the rule, then the AEPO grad_preserved_frac check"
                       + ("" if preserved else ": the check FAILED, phase 2 needs a recorded deviation")}
(d / "decision.json").write_text(json.dumps(decision, indent=2) + "\n")
if preserved:
    (d / "optimizer.txt").write_text(settings + "\n")
PY
  [[ $preserved == 0 ]] || die "phase 1: AEPO at $chosen preserves too few gradients ($dir/$chosen-aepo/rule.json)"
  say "phase 1 done: $chosen ($settings), $dir/decision.json"
}

register() {  # register COMMIT: the commit holding the pre-registration, before any phase-2 run
  local commit; commit=$(git -C "$REPO" rev-parse --verify "${1:?usage: run.sh register COMMIT}^{commit}")
  # the file moved from docs/ to lab/study/ after the study was registered: either place counts
  git -C "$REPO" cat-file -e "$commit:lab/study/preregistration.md" 2>/dev/null ||
    git -C "$REPO" cat-file -e "$commit:docs/preregistration.md" 2>/dev/null ||
    die "$commit has no lab/study/preregistration.md (nor docs/preregistration.md, its place before the lab)"
  [[ ! -f $STUDY/preregistration.txt ]] || [[ $(cat "$STUDY/preregistration.txt") == "$commit" ]] ||
    die "already registered at $(cat "$STUDY/preregistration.txt")"
  echo "$commit" > "$STUDY/preregistration.txt"
  say "pre-registration $commit recorded"
}

rl_overrides() {  # the common overrides of phases 2-3 (tables too): RL settings, the chosen optimizer, K = 8
  [[ -f $STUDY/phase1/optimizer.txt ]] || die "no $STUDY/phase1/optimizer.txt: run phase1 first"
  echo "$RL $(cat "$STUDY/phase1/optimizer.txt") eval.samples=8"
}

compare() {  # compare WORKER ARMS [OUT]: one `aepo compare` process over ARMS of the shared folder
  aepo "$STUDY/logs/$1.log" compare --presets "$2" --steps "$STEPS" --out "${3:-$COMPARE}" $OVERRIDES
}

wait_for() {  # wait_for MARKER PID MESSAGE: until MARKER exists; fails with MESSAGE if process PID ends first
  while [[ ! -f $1 ]]; do
    kill -0 "$2" 2>/dev/null || { say "$3"; return 1; }
    sleep "$POLL"
  done
}

side_by_side() {  # side_by_side PHASE: its two workers, then wait for both
  local phase=$1 a b status=0
  "${phase}_a" & a=$!
  "${phase}_b" "$a" & b=$!
  wait "$a" || status=1
  wait "$b" || status=1
  [[ $status == 0 ]] || die "$phase: a worker failed or was stopped (see $STUDY/logs/$phase-*.log); run the same command to continue"
  say "$phase done"
}

# Phase 2, balanced 12 + 12 runs: worker a runs arpo seeds 0-3, then grpo 0-7; worker b runs aepo 0-7, then
# waits until worker a's arpo 0-3 are finished and runs arpo 0-7 (0-3 are then finished, so it runs 4-7).
# No run folder is ever used by both processes. Marker: $COMPARE/.phase2-arpo0-3.done.
phase2_a() {
  compare phase2-a arpo:4 && touch "$COMPARE/.phase2-arpo0-3.done" && compare phase2-a grpo:8
}
phase2_b() {
  compare phase2-b aepo:8 || return 1
  wait_for "$COMPARE/.phase2-arpo0-3.done" "$1" "phase2: worker a stopped before arpo seeds 0-3 were done" || return 1
  compare phase2-b arpo:8
}
phase3_a() { compare phase3-a gppo:5,aepo_no_sg_clip:5; }
phase3_b() { compare phase3-b aepo_no_branch_penalty:5,arpo_random:5; }
# The replication, balanced 6 + 6 as phase 2: worker a runs arpo seeds 0-1, then grpo 0-3; worker b runs aepo
# 0-3, then (once a's arpo 0-1 are finished) arpo 0-3, that is 2-3. Marker: $REPLICATE/.replicate-arpo0-1.done.
replicate_a() {
  compare replicate-a arpo:2 "$REPLICATE" && touch "$REPLICATE/.replicate-arpo0-1.done" && compare replicate-a grpo:4 "$REPLICATE"
}
replicate_b() {
  compare replicate-b aepo:4 "$REPLICATE" || return 1
  wait_for "$REPLICATE/.replicate-arpo0-1.done" "$1" "replicate: worker a stopped before arpo seeds 0-1 were done" || return 1
  compare replicate-b arpo:4 "$REPLICATE"
}

needs_registration() {
  [[ -f $STUDY/preregistration.txt ]] || die "phases 2-3 start only after the pre-registration is committed: run.sh register COMMIT"
  [[ $(json_get "$STUDY/phase1/decision.json" chosen 2>/dev/null) != None ]] || die "phase 1 chose no optimizer setting"
}

tables() {  # tables OUT ARMS LOG PREFIX: every arm, paired against aepo (H1, E, C, B, T2, X), arpo (G) and grpo
  # (H2, gppo); aepo last; then the verdicts and the figures (lab/study/figures.py: OUT/plots/PREFIX_*.png)
  local out=$1 arms=$2 log="$STUDY/logs/$3.log" prefix=$4 ref
  local dir="$out/tables"
  mkdir -p "$dir"
  for ref in arpo grpo aepo; do
    aepo "$log" compare --table-only --presets "$arms" --reference "$ref" --steps "$STEPS" --out "$out" $OVERRIDES
    cp "$out/compare.md" "$dir/reference-$ref.md"
    cp "$out/compare.json" "$dir/reference-$ref.json"
  done
  "$PYTHON" "$HERE/study_rules.py" verdicts "$out/compare.json" "$dir/verdicts.json" >> "$log"
  PYTHONPATH="$REPO" "$PYTHON" "$HERE/figures.py" "$out" "$out/plots" --prefix "$prefix" >> "$log"
  say "$3: $out/compare.md (reference aepo), $dir/reference-{aepo,arpo,grpo}.md, verdicts in $dir/verdicts.md, figures $out/plots/${prefix}_*.png"
}

stop() {  # SIGTERM to the recorded aepo processes that still run: each finishes its step, saves and exits
  local pid
  [[ -f $STUDY/logs/pids ]] || return 0
  while read -r pid; do
    if kill -0 "$pid" 2>/dev/null && grep -q aepo_rl "/proc/$pid/cmdline" 2>/dev/null; then
      say "stop: SIGTERM to $pid"; kill -TERM "$pid"
    fi
  done < "$STUDY/logs/pids"
}

case ${1:-} in
  phase0|phase1) check_frozen; lock_phase "$1"; say "$1 (src $SRC at $(cat "$STUDY/commit.txt"))"; "$1" ;;
  phase2|phase3) check_frozen; needs_registration; lock_phase "$1"; OVERRIDES=$(rl_overrides)
                 say "$1 (src $SRC, pre-registration $(cat "$STUDY/preregistration.txt")): $OVERRIDES"
                 mkdir -p "$COMPARE"; side_by_side "$1" ;;
  tables) check_frozen; OVERRIDES=$(rl_overrides); tables "$COMPARE" "$PHASE2_ARMS,$PHASE3_ARMS" tables study ;;
  replicate) check_frozen; needs_registration; lock_phase "$1"; OVERRIDES="$(rl_overrides) $REPLICATE_WORLD"
             say "$1 (exploratory, src $SRC): $OVERRIDES"
             mkdir -p "$REPLICATE"; side_by_side "$1" ;;
  replicate-tables) check_frozen; OVERRIDES="$(rl_overrides) $REPLICATE_WORLD"; tables "$REPLICATE" "$REPLICATE_ARMS" replicate-tables replicate ;;
  register) register "${2:-}" ;;
  stop) stop ;;
  *) sed -n 2,16p "$0"; exit 2 ;;
esac
