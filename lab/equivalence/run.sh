#!/usr/bin/env bash
# The pre-registered equivalence study (lab/equivalence/preregistration.md): one command per phase, each
# resumable (run the same command again to continue an interrupted phase).
#
#   run.sh phase0            the world's SFT model (WORLD: g4, the default; g2; g1), in $STUDY/$WORLD/phase0
#   run.sh phaseA [a|b]      GRPO calibration, R0-R3 x seeds 100-102 on dev (worker a: R0 R1, b: R2 R3, none: all)
#   run.sh decide            phase A's rule (rules.py decide): $STUDY/$WORLD/phaseA/decision.json and optimizer.txt
#   run.sh register COMMIT   record the commit holding preregistration.md (phase B needs it)
#   run.sh phaseB            grpo, arpo, aepo x n seeds (n from decision.json), two workers side by side
#   run.sh tables            refuses until every phase-B run finished; then the table and the verdicts
#   run.sh stop              SIGTERM to this study's running aepo processes (each saves its step)
#
# Variables: SRC (the frozen checkout the study runs) and STUDY (its output folder), both required; WORLD
# (default g4); PYTHON (default python); THREADS (phase 0's SFT, default 2; every RL process runs one).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "${SRC:?set SRC to the frozen checkout the study runs}" && pwd)
STUDY=${STUDY:?set STUDY to the study output folder}
WORLD=${WORLD:-g4}
PYTHON=${PYTHON:-python}
mkdir -p "$STUDY/logs"
STUDY=$(cd "$STUDY" && pwd)
export PYTHONPATH="$SRC" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# The worlds in their fallback order (preregistration, "World"): the multi-hop study's G4, then 2 hops, then the
# main job's 1-hop task at its defaults.
case $WORLD in
  g4) TASK="task.max_hops=3 rollout.max_response_length=384 sft.max_length=768 model.tiny_num_layers=3 task.teacher_error_rate=0.25" ;;
  g2) TASK="task.max_hops=2 rollout.max_response_length=384 sft.max_length=768 model.tiny_num_layers=3 task.teacher_error_rate=0.25" ;;
  g1) TASK="" ;;
  *) echo "WORLD=$WORLD: one of g4, g2, g1" >&2; exit 2 ;;
esac
W="$STUDY/$WORLD"
RL="$TASK model.path=$W/phase0/checkpoints/sft sft.epochs=0 trainer.batch_size=8 rollout.n=8 rollout.temperature=0.9 eval.samples=8 trainer.eval_every=0"
STEPS=100
EPS01="algorithm.clip_ratio_low=0.1 algorithm.clip_ratio_high=0.1"
declare -A CANDIDATE=(
  [R0]=""
  [R1]="trainer.mini_batch_size=1 $EPS01"
  [R2]="trainer.batch_size=16 trainer.mini_batch_size=2"
  [R3]="$EPS01 trainer.warmup_steps=5"
)
CALIBRATION="trainer.seed=100 rollout.seed=100 eval.split=dev"

say() { echo "[$(date -u +%FT%TZ)] $*" | tee -a "$STUDY/logs/run.log" >&2; }
die() { say "ERROR: $*"; exit 1; }

aepo() {  # aepo LOG ARGS...: `python -m aepo_rl ARGS` of the frozen checkout, its pid kept for `run.sh stop`
  local log=$1; shift
  echo "[$(date -u +%FT%TZ)] aepo $*" >> "$log"
  (cd "$SRC" && exec "$PYTHON" -m aepo_rl "$@") >> "$log" 2>&1 &
  local pid=$!
  echo "$pid" >> "$STUDY/logs/pids"
  wait "$pid"
}

check_frozen() {  # the checkout is clean and at the commit of every earlier phase
  [[ -z $(git -C "$SRC" status --porcelain --untracked-files=no) ]] || die "$SRC has local changes: the study runs one frozen commit"
  local commit; commit=$(git -C "$SRC" rev-parse HEAD)
  [[ ! -f $STUDY/commit.txt ]] || [[ $(cat "$STUDY/commit.txt") == "$commit" ]] || die "$SRC is at $commit, the study at $(cat "$STUDY/commit.txt")"
  echo "$commit" > "$STUDY/commit.txt"
}

phase0() {
  mkdir -p "$W/phase0"
  [[ -f $W/phase0/sft_metrics.json && -d $W/phase0/checkpoints/sft ]] ||
    OMP_NUM_THREADS=${THREADS:-2} aepo "$STUDY/logs/$WORLD-phase0.log" sft --out "$W/phase0" $TASK eval.num_questions=16 eval.samples=1
  say "phase 0 ($WORLD) done: $W/phase0/checkpoints/sft"
}

phaseA() {  # phaseA [a|b]: one `aepo compare` over the worker's candidates, seeds 100-102, on dev
  [[ -d $W/phase0/checkpoints/sft ]] || die "phase A needs phase 0's SFT model: run.sh phase0"
  local names
  case ${1:-all} in a) names="R0 R1" ;; b) names="R2 R3" ;; all) names="R0 R1 R2 R3" ;; *) die "phaseA: worker a or b" ;; esac
  local args=() name
  for name in $names; do args+=(--arm "$name=grpo:3 ${CANDIDATE[$name]}"); done
  aepo "$STUDY/logs/$WORLD-phaseA-${1:-all}.log" compare "${args[@]}" --steps "$STEPS" --out "$W/phaseA" $RL $CALIBRATION
  say "phase A ($WORLD, ${1:-all}) done"
}

decide() {
  local status=0
  "$PYTHON" "$HERE/rules.py" decide "$W/phaseA" "$W/phaseA/decision.json" || status=$?
  [[ $status == 0 ]] || die "phase A ($WORLD): no phase B ($W/phaseA/decision.json: stop)"
  local chosen; chosen=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen'])" "$W/phaseA/decision.json")
  echo "${CANDIDATE[$chosen]}" > "$W/phaseA/optimizer.txt"
  say "phase A ($WORLD) decided: $chosen (${CANDIDATE[$chosen]}), $W/phaseA/decision.json"
}

register() {  # register COMMIT: the commit holding lab/equivalence/preregistration.md, before any phase-B run
  local commit; commit=$(git -C "$SRC" rev-parse --verify "${1:?usage: run.sh register COMMIT}^{commit}")
  git -C "$SRC" cat-file -e "$commit:lab/equivalence/preregistration.md" 2>/dev/null || die "$commit has no lab/equivalence/preregistration.md"
  [[ ! -f $STUDY/preregistration.txt ]] || [[ $(cat "$STUDY/preregistration.txt") == "$commit" ]] ||
    die "already registered at $(cat "$STUDY/preregistration.txt")"
  echo "$commit" > "$STUDY/preregistration.txt"
  say "pre-registration $commit recorded"
}

seeds() {  # phase B's seeds per arm, from the decision
  [[ -f $STUDY/preregistration.txt ]] || die "phase B starts only after the pre-registration is recorded: run.sh register COMMIT"
  [[ -f $W/phaseA/optimizer.txt ]] || die "no $W/phaseA/optimizer.txt: run.sh decide"
  "$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['n'])" "$W/phaseA/decision.json"
}

compare_b() {  # compare_b WORKER ARMS: one `aepo compare` over ARMS of phase B's folder (test split, seeds 0..n-1)
  aepo "$STUDY/logs/$WORLD-phaseB-$1.log" compare --presets "$2" --steps "$STEPS" --out "$W/phaseB" $RL $(cat "$W/phaseA/optimizer.txt")
}

phaseB() {  # balanced: worker a runs arpo 0..h-1 then grpo; worker b runs aepo, then arpo (h..n-1 are left)
  local n h marker a b status=0
  n=$(seeds); h=$(( (n + 1) / 2 )); marker="$W/phaseB/.arpo-first-half.done"
  mkdir -p "$W/phaseB"
  say "phase B ($WORLD): grpo, arpo, aepo x $n seeds, $(cat "$W/phaseA/optimizer.txt")"
  ( compare_b a "arpo:$h" && touch "$marker" && compare_b a "grpo:$n" ) & a=$!
  ( compare_b b "aepo:$n" && while [[ ! -f $marker ]]; do kill -0 "$a" 2>/dev/null || exit 1; sleep 20; done &&
    compare_b b "arpo:$n" ) & b=$!
  wait "$a" || status=1
  wait "$b" || status=1
  [[ $status == 0 ]] || die "phase B: a worker failed or was stopped (logs $STUDY/logs/$WORLD-phaseB-*.log); run the same command to continue"
  say "phase B ($WORLD) done"
}

tables() {
  local n arm i missing=0
  n=$(seeds)
  for arm in grpo arpo aepo; do
    for (( i = 0; i < n; i++ )); do
      "$PYTHON" -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get('rl') else 1)" "$W/phaseB/$arm-seed$i/eval.json" 2>/dev/null || missing=$((missing + 1))
    done
  done
  [[ $missing == 0 ]] || die "tables: $missing of $((3 * n)) phase-B runs are not finished; no outcome is read before all are"
  aepo "$STUDY/logs/$WORLD-tables.log" compare --table-only --presets "grpo:$n,arpo:$n,aepo:$n" --reference arpo \
    --steps "$STEPS" --out "$W/phaseB" $RL $(cat "$W/phaseA/optimizer.txt")
  "$PYTHON" "$HERE/rules.py" verdicts "$W/phaseB/compare.json" "$W/phaseB/verdicts.json"
}

stop() {
  local pid
  [[ -f $STUDY/logs/pids ]] || return 0
  while read -r pid; do
    if kill -0 "$pid" 2>/dev/null && grep -q aepo_rl "/proc/$pid/cmdline" 2>/dev/null; then
      say "stop: SIGTERM to $pid"; kill -TERM "$pid"
    fi
  done < "$STUDY/logs/pids"
}

case ${1:-} in
  phase0) check_frozen; phase0 ;;
  phaseA) check_frozen; phaseA "${2:-}" ;;
  decide) check_frozen; decide ;;
  register) register "${2:-}" ;;
  phaseB) check_frozen; phaseB ;;
  tables) check_frozen; tables ;;
  stop) stop ;;
  *) sed -n 2,15p "$0"; exit 2 ;;
esac
