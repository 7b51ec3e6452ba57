"""The folder a new method starts from (docs/adding_a_method.md): copy it to `parser/methods/<name>/`,
rename the class, and add `configs/method/<name>.yaml` with `_target_: parser.methods.<name>.<Class>`.

As shipped it is a complete method, closed-book answering: the lead gets the question without the
document, in one call (how much a model answers from what it already knows). Imports inside the
folder are relative, so a copy works under any package name; tests/e2e/test_method_template_on_cpu.py
copies it out of the repository and runs it through eval.run.
"""
from .method import PROMPTS, ClosedBookMethod

__all__ = ["PROMPTS", "ClosedBookMethod"]
