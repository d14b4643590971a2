#!/usr/bin/env bash
# The per-level table, SFT -> stage 2 -> RL, for the CUDA policy (policies/h200) on a
# machine with no GPU: every stage on the CPU backend, one process at a time, so that each
# step's timings are its own. For a machine with no GPU; the H200 version
# is dev/h200_evidence.sh with KF_SELFSUP=first.
#   bench/launch/cpu_stages.sh [WORK]        (default runs/cpu-stages; needs ./setup.sh's build)
# Environment: KF_START (default policies/h200), KF_RL_MINUTES (default 20), KF_SCORE_N
# (default 6), KF_S2_SAMPLES (default 8).
# Steps (55 minutes on a 2-core machine):
#  1. stage 2: one tools/selfsup round from KF_START on the 17 train tasks of
#     configs/cpu_stages.yaml (CPU kernels; the retraining takes the corpus's CPU examples,
#     as this machine's tasks have CPU artifacts only, and the kept kernels);
#  2. RL: tools/launch configs/cpu_stages.yaml from the stage-2 policy (from KF_START if
#     stage 2 failed) for KF_RL_MINUTES, then tools/export of its final checkpoint;
#  3. the three policies scored one after the other by tools/score-policy: the same 17
#     tasks (train) and the held-out split, KF_SCORE_N samples a task, no-exemplar prompts,
#     seed 0, one task at a time.
#  4. tools/score-policy --compare of the three: WORK/compare.md, the issue's table.
# Outputs in WORK: policy-s2/, policy-rl/, score-{sft,s2,rl}/table.md, compare.md, logs/, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-runs/cpu-stages}
START=${KF_START:-policies/h200}
CONFIG=configs/cpu_stages.yaml
RUN=cpu-stages-rl
mkdir -p "$WORK/logs"
stamp() { echo "$(date -u +%FT%TZ) cpu_stages: $*" | tee -a "$WORK/summary.txt"; }
[ -x build/stages/kf-selfsup ] || { echo "cpu_stages: build/ has no kf-selfsup; run ./setup.sh first" >&2; exit 2; }
[ -f "$START/config.json" ] || { echo "cpu_stages: KF_START=$START: no config.json (not a policy folder)" >&2; exit 2; }
# The config is the one list of train tasks: its single-line tasks.include.
train=$(sed -n 's/^  include: \[\(.*\)\]/\1/p' $CONFIG | tr -d ' ')
[ -n "$train" ] || { echo "cpu_stages: $CONFIG: no one-line tasks.include list" >&2; exit 2; }
heldout=$(grep -v '^#' tasks/heldout.txt | grep . | paste -sd, -)

stamp "start from $START; train tasks $train"
SECONDS=0
tools/selfsup --model "$START" --corpus corpus --out "$WORK/policy-s2" --rounds 1 \
  --samples "${KF_S2_SAMPLES:-8}" --temperature 1.2 --max-new-tokens 2048 --exemplars 2 --steps 40 --batch 4 \
  --backend cpu --tasks build/tasks --heldout tasks/heldout.txt --include "$train" --device cpu --threads 2 \
  > "$WORK/logs/selfsup.txt" 2>&1
rc=$?
# The round's totals (its per-task table is in logs/selfsup.txt).
totals=$(tail -1 "$WORK/policy-s2/selfsup.jsonl" 2>/dev/null | sed 's/,"per_task":\[[^]]*\]//')
stamp "stage 2 exit $rc after ${SECONDS} s: $totals"
rl_start=$START
if [ $rc = 0 ] && [ -f "$WORK/policy-s2/config.json" ]; then rl_start=$WORK/policy-s2
else stamp "stage 2 failed: RL starts from $START and no stage-2 policy is scored"; fi

SECONDS=0
rm -rf "runs/$RUN"
tools/launch $CONFIG --name $RUN --set learner.policy="$rl_start" \
  --set launch.max_minutes="${KF_RL_MINUTES:-20}" > "$WORK/logs/launch.txt" 2>&1
stamp "RL run exit $? after ${SECONDS} s: $(grep -E 'status:' runs/$RUN/logs/launch-0.log | tail -1)"
tools/export runs/$RUN "$WORK/policy-rl" > "$WORK/logs/export.txt" 2>&1 || stamp "tools/export failed (see logs/export.txt): RL not scored"

for pol in sft s2 rl; do
  case $pol in
    sft) model=$START; label="SFT ($START)" ;;
    s2) model=$WORK/policy-s2; label="after stage 2 (one CPU round)" ;;
    rl) model=$WORK/policy-rl; label="after RL ($RUN, from $(basename "$rl_start"))" ;;
  esac
  [ -f "$model/config.json" ] || { stamp "$pol: no policy at $model, not scored"; continue; }
  SECONDS=0
  tools/score-policy --model "$model" --out "$WORK/score-$pol" --config $CONFIG --backend cpu \
    --include "$train,$heldout" -n "${KF_SCORE_N:-6}" --jobs 1 --seed 0 --label "$label" \
    > "$WORK/logs/score-$pol.txt" 2>&1
  stamp "scored $pol (exit $?) in ${SECONDS} s"
done
# The issue's table: the three policies side by side per (split, level).
scored=()
for pol in sft s2 rl; do [ -f "$WORK/score-$pol/scores.json" ] && scored+=("$WORK/score-$pol"); done
if [ ${#scored[@]} -ge 2 ]; then
  tools/score-policy --compare "${scored[@]}" --out "$WORK/compare.md" > /dev/null 2>> "$WORK/logs/compare.txt" \
    && stamp "table: $WORK/compare.md" || stamp "tools/score-policy --compare failed (logs/compare.txt)"
fi
stamp "done"
