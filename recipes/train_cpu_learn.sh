#!/usr/bin/env bash
# RL that measurably learns, end to end on a CPU (`make learn`; configs/train/cpu_learn.yaml):
# data -> warm-started lead -> eval without RL -> GRPO in verl's separate_async trainer ->
# checkpoint -> Hugging Face weights (verl's model merger) -> eval with RL -> Table 7 + curve + summary.
# Table 7 and summary.json evaluate the lead greedy, as the paper does (eval/learn_cpu); report/sampled/
# has the same evals with the lead sampled at the training temperature (eval/learn_cpu_sampled).
#
#   recipes/train_cpu_learn.sh                         # the full run -> outputs/learn/summary.json
#   recipes/train_cpu_learn.sh --smoke                 # the same pipeline at 2 steps (CI); learning not judged
#   LEARN_DIR=/tmp/learn recipes/train_cpu_learn.sh trainer.total_training_steps=60   # extra args: trainer overrides
#
# The subagents are the loopback worker's world readers (parser/serving/world_reader.py) standing in
# for SGLang subagents: they hold the synthetic world's facts and answer from their chunk only.
# Every stage is seeded (parser.seed); data, the warm-started lead (asset cache) and finished
# eval rows are reused when the script runs again, the trainer resumes from its last checkpoint.
# Each stage's wall time and the load average go to $LEARN_DIR/timings.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
if [[ "${1:-}" == "--smoke" ]]; then SMOKE=1; shift; fi
LEARN_DIR=${LEARN_DIR:-outputs/learn}
PYTHON=${PYTHON:-python}
PARSER=("$PYTHON" -m parser)  # the `parser` command (parser --help) of this checkout, on this recipe's Python
SUBAGENT_PORT=${SUBAGENT_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export HYDRA_FULL_ERROR=1
# one thread per process: the trainer, the rollout server, the readers and eval share the cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export WANDB_DIR=${WANDB_DIR:-$LEARN_DIR}   # wandb runs offline unless you are logged in (parser.train)

# ---- sizes ------------------------------------------------------------------------------------
DATA=() WARM=() TRAIN=() EVAL=() JUDGE=(--require-learning)
if (( SMOKE )); then
    DATA=(num_train=8 num_warmup=16 num_heldout=4 'heldout_lengths=[20]')
    WARM=(parser.warm_start.steps=20 parser.warm_start.copy_steps=20)
    TRAIN=(trainer.total_training_steps=2 trainer.save_freq=1 data.train_batch_size=2
           actor_rollout_ref.actor.ppo_mini_batch_size=2 trainer.v1.sampler.sampler_kwargs.max_filtered_groups_per_step=0)
    EVAL=(runs=1 'dataset.lengths=[20]')
    JUDGE=()
fi

mkdir -p "$LEARN_DIR"
stage() {  # stage NAME COMMAND...: run it, log its wall time and the load average
    local name=$1 start=$SECONDS; shift
    echo "== $name (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    "$@"
    echo "$name $((SECONDS - start)) s (load after: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$LEARN_DIR/timings.txt"
}

# ---- readers ----------------------------------------------------------------------------------
"${PARSER[@]}" loopback --port "$SUBAGENT_PORT" --reader world --no-records \
    > "$LEARN_DIR/readers.log" 2>&1 &
READERS_PID=$!
trap 'kill -TERM "$READERS_PID" 2>/dev/null || true; wait "$READERS_PID" 2>/dev/null || true' EXIT
export PARSER_GATEWAY_URL="http://127.0.0.1:${SUBAGENT_PORT}"
for _ in $(seq 1 120); do
    curl -sf "$PARSER_GATEWAY_URL/health" > /dev/null && break
    kill -0 "$READERS_PID" 2>/dev/null || { echo "readers exited; see $LEARN_DIR/readers.log" >&2; exit 1; }
    sleep 0.5
done

DATA_DIR=$LEARN_DIR/data
EVAL_ARGS=("dataset.path=\"$DATA_DIR/heldout_{length}.json\"" progress=false "${EVAL[@]}")
GREEDY=(--config-name learn_cpu) SAMPLED=(--config-name learn_cpu_sampled)

# ---- data, warm start, eval without RL --------------------------------------------------------
stage data "${PARSER[@]}" data --config-name learn_cpu out_dir="$DATA_DIR" "${DATA[@]}"
stage warm_start "${PARSER[@]}" train warm-start --data "$DATA_DIR" --out "$LEARN_DIR/lead" \
    --gateway-url "$PARSER_GATEWAY_URL" "${WARM[@]}"
stage eval_before "${PARSER[@]}" eval "${GREEDY[@]}" "${EVAL_ARGS[@]}" models.lead.model="$LEARN_DIR/lead" \
    'report.variant="w/o RL"' out_dir="$LEARN_DIR/eval/before"
stage eval_before_sampled "${PARSER[@]}" eval "${SAMPLED[@]}" "${EVAL_ARGS[@]}" models.lead.model="$LEARN_DIR/lead" \
    'report.variant="w/o RL"' out_dir="$LEARN_DIR/eval/before_sampled"

# ---- GRPO -------------------------------------------------------------------------------------
stage train env VERL_FILE_LOGGER_PATH="$LEARN_DIR/train_metrics.jsonl" \
    "${PARSER[@]}" train --config-name train/cpu_learn \
    actor_rollout_ref.model.path="$LEARN_DIR/lead" \
    data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/val.parquet" \
    trainer.default_local_dir="$LEARN_DIR/checkpoints" "${TRAIN[@]}" "$@"

# ---- checkpoint -> Hugging Face weights (verl's merger; tokenizer from the checkpoint) ----------
STEP=$(cat "$LEARN_DIR/checkpoints/latest_checkpointed_iteration.txt")
stage merge "$PYTHON" -m verl.model_merger merge --backend fsdp \
    --local_dir "$LEARN_DIR/checkpoints/global_step_$STEP/actor" --target_dir "$LEARN_DIR/lead_rl"

# ---- eval with RL, Table 7, curve, summary -----------------------------------------------------
stage eval_after "${PARSER[@]}" eval "${GREEDY[@]}" "${EVAL_ARGS[@]}" models.lead.model="$LEARN_DIR/lead_rl" \
    'report.variant="w/ RL"' out_dir="$LEARN_DIR/eval/after"
stage eval_after_sampled "${PARSER[@]}" eval "${SAMPLED[@]}" "${EVAL_ARGS[@]}" models.lead.model="$LEARN_DIR/lead_rl" \
    'report.variant="w/ RL"' out_dir="$LEARN_DIR/eval/after_sampled"
stage report_sampled "${PARSER[@]}" report "$LEARN_DIR/eval/before_sampled" "$LEARN_DIR/eval/after_sampled" \
    --out "$LEARN_DIR/report/sampled" --no-viewer
stage report "${PARSER[@]}" report "$LEARN_DIR/eval/before" "$LEARN_DIR/eval/after" --out "$LEARN_DIR/report" \
    --no-viewer --train-log "$LEARN_DIR/train_metrics.jsonl" --summary "$LEARN_DIR/summary.json" "${JUDGE[@]}"

echo "== done: checkpoint at $LEARN_DIR/checkpoints/global_step_$STEP/actor, merged lead at $LEARN_DIR/lead_rl"
echo "   Table 7: $LEARN_DIR/report/rl.md, verdict: $LEARN_DIR/summary.json, stage times: $LEARN_DIR/timings.txt"
echo "   next: parser eval --config-name learn_cpu models.lead.model=$LEARN_DIR/lead_rl dataset.path=\"$DATA_DIR/heldout_{length}.json\" out_dir=outputs/eval/learned"
