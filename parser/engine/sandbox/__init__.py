"""The DCI agent's read-only corpus tools: what may run (`tools`), each command's exact options
(`options`) and how one command runs under its limits and deadline (`process`). docs/security.md."""
