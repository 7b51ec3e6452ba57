"""Chain-of-Agents (configs/method/coa.yaml): the class and its prompts (`prompts/`)."""
from parser.methods.coa.method import NO_UNIT, PROMPTS, ChainOfAgentsMethod

__all__ = ["NO_UNIT", "PROMPTS", "ChainOfAgentsMethod"]
