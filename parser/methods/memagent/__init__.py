"""MemAgent (configs/method/memagent.yaml): the class and its prompts (`prompts/`)."""
from parser.methods.memagent.method import NO_MEMORY, PROMPTS, MemAgentMethod

__all__ = ["NO_MEMORY", "PROMPTS", "MemAgentMethod"]
