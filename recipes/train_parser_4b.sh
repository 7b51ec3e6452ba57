#!/usr/bin/env bash
# ParSer 4B lead (Qwen3.5-4B), paper Table 9: gateway + fully async GRPO. See recipes/train_parser.sh.
#   recipes/train_parser_4b.sh [hydra overrides...]
MODEL_SIZE=4b exec "$(dirname "$0")/train_parser.sh" "$@"
