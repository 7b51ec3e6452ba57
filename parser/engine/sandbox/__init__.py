"""The DCI agent's read-only corpus tools: what may run (`tools`), each command's exact options
(`options`) and how one command runs under its limits and deadline (`process`); and the RLM REPL, where
model-written Python runs in an isolated worker process (`repl`, the worker `repl_worker`). docs/security.md."""
