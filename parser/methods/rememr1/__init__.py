"""ReMemR1 (configs/method/rememr1.yaml): MemAgent with a callback memory; the class and its prompts (`prompts/`)."""
from parser.methods.rememr1.method import PROMPTS, ReMemR1Method, TfidfRecall

__all__ = ["PROMPTS", "ReMemR1Method", "TfidfRecall"]
