"""`method=rlm`: Recursive Language Models as rlms 0.1.3 runs them (parser/methods/rlm/method.py)."""
from .method import RLMMethod

__all__ = ["RLMMethod"]
