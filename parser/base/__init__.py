"""Ground floor: where configs live and how a preset is composed (`config`, `resources`,
`hydra_help`). Imports nothing else of `parser`; every floor above may import it."""
