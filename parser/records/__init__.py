"""The typed things floors hand each other, and their files: the dataset `Record` (`sample`), the
episode `Trajectory`, eval's `ResultRow` (`result`), the RL row reader (`rl_rows`) and the
interruption-proof JSON files (`jsonl`). Imports only `base` and `text`."""
