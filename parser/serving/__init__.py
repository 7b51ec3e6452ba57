"""Everything that talks to a model: the `Backend` interface (`types`), one `Dialect` per wire format
(`wire/`), the backends (`backends/`), the retry policy, the CPU model server (`server`), the
loopback worker and the gateway. Imports `base`, `text` and `offline` (the offline model names)
only (tests/test_import_graph_on_cpu.py `FLOORS`)."""
