#!/usr/bin/env bash
# The ParSer training run on a CPU: verl 0.9.1's separate_async trainer, 2 GRPO steps of a tiny
# lead against loopback subagents over HTTP, a checkpoint at step 2 (configs/train/cpu_smoke.yaml).
#
#   recipes/train_cpu_smoke.sh                                   # 2 steps -> checkpoint
#   recipes/train_cpu_smoke.sh trainer.total_training_steps=3    # again: resumes at step 2, runs step 3
#   SMOKE_DIR=/tmp/smoke recipes/train_cpu_smoke.sh              # where lead, data, checkpoints go
#
# Steps: start a loopback subagent worker (parser/serving/loopback.py, answers with a finding
# where the needle is), build the tiny lead and the verl parquet once (`parser train smoke`,
# parser/cli/train_smoke.py), then `parser train --config-name train/cpu_smoke`. Stops the
# worker on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE_DIR=${SMOKE_DIR:-runs/cpu_smoke}
SUBAGENT_PORT=${SUBAGENT_PORT:-31001}
PYTHON=${PYTHON:-python}
PARSER=("$PYTHON" -m parser)  # the `parser` command (parser --help) of this checkout, on this recipe's Python
export HYDRA_FULL_ERROR=1
# one thread per process: the trainer, the rollout server and the workers share the cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

mkdir -p "$SMOKE_DIR"
"${PARSER[@]}" loopback --port "$SUBAGENT_PORT" --needle "directed by Miro Tal" \
    > "$SMOKE_DIR/subagents.log" 2>&1 &
SUBAGENT_PID=$!
trap 'kill -TERM "$SUBAGENT_PID" 2>/dev/null || true; wait "$SUBAGENT_PID" 2>/dev/null || true' EXIT
export PARSER_GATEWAY_URL="http://127.0.0.1:${SUBAGENT_PORT}"
for _ in $(seq 1 60); do
    curl -sf "$PARSER_GATEWAY_URL/health" > /dev/null && break
    kill -0 "$SUBAGENT_PID" 2>/dev/null || { echo "subagent worker exited; see $SMOKE_DIR/subagents.log" >&2; exit 1; }
    sleep 0.5
done

if [[ ! -f "$SMOKE_DIR/data/train.parquet" || ! -d "$SMOKE_DIR/lead" ]]; then
    "${PARSER[@]}" train smoke --out "$SMOKE_DIR" --gateway-url "$PARSER_GATEWAY_URL"
fi

# Refuses up front on a machine that cannot run it; ends by printing where the checkpoint is and
# the next commands (merge -> eval): parser/train/machine.py.
"${PARSER[@]}" train --config-name train/cpu_smoke \
    actor_rollout_ref.model.path="$SMOKE_DIR/lead" \
    data.train_files="$SMOKE_DIR/data/train.parquet" data.val_files="$SMOKE_DIR/data/val.parquet" \
    trainer.default_local_dir="$SMOKE_DIR/checkpoints" \
    "$@"
