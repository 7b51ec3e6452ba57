"""Everything that talks to a model: the `Backend` interface (`types`), the wire formats (`wire/`),
the backends (`backends/`), the retry policy, the CPU model server (`server`) and the gateway.
Imports `base` and `text` only."""
