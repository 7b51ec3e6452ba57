"""InfMem (configs/method/infmem.yaml): MemAgent's memory with a Retrieval Planner, retrieval inside the
document and early stopping; the class and its prompts (`prompts/`)."""
from parser.methods.infmem.method import NO_MEMORY, PROMPTS, InfMemMethod

__all__ = ["NO_MEMORY", "PROMPTS", "InfMemMethod"]
