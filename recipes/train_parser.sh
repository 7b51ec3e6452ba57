#!/usr/bin/env bash
# Launch a whole ParSer GRPO run: the subagent gateway (frozen Qwen3.5-4B workers behind smg,
# which pins each chunk to one worker), then verl's fully asynchronous trainer with the ParSer agent loop.
#
#   MODEL_SIZE=4b recipes/train_parser.sh                       # = recipes/train_parser_4b.sh
#   MODEL_SIZE=9b recipes/train_parser.sh trainer.save_freq=5   # extra args = Hydra overrides
#   PARSER_GATEWAY_URL=http://10.0.0.5:30000 recipes/train_parser_4b.sh   # gateway runs elsewhere
#
# Default layout, one 8-GPU node: GPUs 0-5 for verl (4 rollout + 2 trainer, paper Table 9),
# GPUs 6-7 for two subagent workers. The paper used 10 more GPUs for subagents: run
# parser/cli/gateway.py there and export PARSER_GATEWAY_URL instead.
# Stops the gateway it started (by PID) when training exits. Checkpoints resume automatically.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- model --------------------------------------------------------------------------------
MODEL_SIZE=${MODEL_SIZE:-4b}                 # 4b | 9b -> configs/train/parser_${MODEL_SIZE}.yaml
LEAD_MODEL=${LEAD_MODEL:-}                   # override actor_rollout_ref.model.path (local dir on offline clusters)

# ---- data ---------------------------------------------------------------------------------
# Built by `parser data --config-name hotpotqa_train` (its knowledge filter needs a
# Qwen3.5-9B server: README "Data") and `--config-name hotpotqa_val`.
TRAIN_FILES=${TRAIN_FILES:-data/train/hotpotqa_train.parquet}
VAL_FILES=${VAL_FILES:-data/train/hotpotqa_val.parquet}

# ---- GPUs ---------------------------------------------------------------------------------
VERL_GPUS=${VERL_GPUS:-0,1,2,3,4,5}          # rollout (4) + trainer (2) for verl's Ray cluster
ROLLOUT_GPUS=${ROLLOUT_GPUS:-4}              # actor_rollout_ref.rollout.n_gpus_per_node
TRAINER_GPUS=${TRAINER_GPUS:-2}              # trainer.n_gpus_per_node
SUBAGENT_FIRST_GPU=${SUBAGENT_FIRST_GPU:-6}  # subagent workers take GPUs from here on
SUBAGENT_WORKERS=${SUBAGENT_WORKERS:-2}      # one SGLang server per GPU

# ---- subagent gateway ---------------------------------------------------------------------
SUBAGENT_MODEL=${SUBAGENT_MODEL:-Qwen/Qwen3.5-4B}
GATEWAY_PORT=${GATEWAY_PORT:-30000}
GATEWAY_READY_TIMEOUT_S=${GATEWAY_READY_TIMEOUT_S:-1800}

# ---- logging ------------------------------------------------------------------------------
# wandb stays offline unless you are logged in (parser.train decides; WANDB_MODE wins).
export HYDRA_FULL_ERROR=1

GATEWAY_PID=""
cleanup() {
    if [[ -n "$GATEWAY_PID" ]] && kill -0 "$GATEWAY_PID" 2>/dev/null; then
        echo "stopping the gateway (pid $GATEWAY_PID)"
        kill -TERM "$GATEWAY_PID"
        wait "$GATEWAY_PID" || true
    fi
}
trap cleanup EXIT

if [[ -z "${PARSER_GATEWAY_URL:-}" ]]; then
    export PARSER_GATEWAY_URL="http://127.0.0.1:${GATEWAY_PORT}"
    mkdir -p logs
    parser gateway \
        workers.num="$SUBAGENT_WORKERS" workers.first_gpu="$SUBAGENT_FIRST_GPU" \
        workers.model_path="$SUBAGENT_MODEL" router.port="$GATEWAY_PORT" \
        > "logs/gateway-$(date +%Y%m%d-%H%M%S).log" 2>&1 &
    GATEWAY_PID=$!
    echo "gateway starting (pid $GATEWAY_PID) at $PARSER_GATEWAY_URL"
    deadline=$((SECONDS + GATEWAY_READY_TIMEOUT_S))
    until curl -sf "$PARSER_GATEWAY_URL/readiness" > /dev/null; do
        kill -0 "$GATEWAY_PID" 2>/dev/null || { echo "gateway exited; see logs/gateway-*.log" >&2; exit 1; }
        (( SECONDS < deadline )) || { echo "gateway not ready after ${GATEWAY_READY_TIMEOUT_S}s" >&2; exit 1; }
        sleep 10
    done
    echo "gateway ready"
fi

overrides=(
    # data
    data.train_files="$TRAIN_FILES" data.val_files="$VAL_FILES"
    # resources
    actor_rollout_ref.rollout.n_gpus_per_node="$ROLLOUT_GPUS" trainer.n_gpus_per_node="$TRAINER_GPUS"
    # subagents
    parser.gateway_url="$PARSER_GATEWAY_URL" parser.subagent.tokenizer="$SUBAGENT_MODEL"
)
[[ -n "$LEAD_MODEL" ]] && overrides+=(actor_rollout_ref.model.path="$LEAD_MODEL")

# Refuses up front on a machine that cannot run it; ends by printing where the checkpoint is and
# the next commands (merge -> eval): parser/train/machine.py.
CUDA_VISIBLE_DEVICES="$VERL_GPUS" parser train --config-name "train/parser_${MODEL_SIZE}" \
    "${overrides[@]}" "$@"
