"""ParSer: the lead scatters queries to one subagent per chunk and gathers findings (configs/method/parser.yaml).

The engine and its prompts are shared (`parser.engine.episode`, `parser/engine/prompts/v1`); this folder holds
only the method that runs them on a sample."""
from parser.methods.parser.method import ParSerMethod

__all__ = ["ParSerMethod"]
