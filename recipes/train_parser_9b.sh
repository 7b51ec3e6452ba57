#!/usr/bin/env bash
# ParSer 9B lead (Qwen3.5-9B), paper Table 9: gateway + fully async GRPO. See recipes/train_parser.sh.
#   recipes/train_parser_9b.sh [hydra overrides...]
MODEL_SIZE=9b exec "$(dirname "$0")/train_parser.sh" "$@"
