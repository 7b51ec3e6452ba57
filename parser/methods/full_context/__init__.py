"""Full-context answering (configs/method/full_context.yaml): the class and its prompts (`prompts/`)."""
from parser.methods.full_context.method import PROMPTS, ContextOverflow, FullContextMethod

__all__ = ["PROMPTS", "ContextOverflow", "FullContextMethod"]
