"""The DCI agent (configs/method/dci.yaml): the class and its prompts (`prompts/`); the sandbox is `parser.engine.sandbox.tools`."""
from parser.methods.dci.method import PROMPTS, DCIAgentMethod

__all__ = ["PROMPTS", "DCIAgentMethod"]
