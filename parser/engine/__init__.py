"""The one agent loop and what it is built from, shared by two or more methods: the episode
engine, tool sets, protocol, gather, reading orders, readers, prompts and the DCI sandbox.
Imports `base`, `text`, `records` and `serving`."""
