"""The paper's baselines as registered methods, run by the same eval command as ParSer.

    build_method("full_context" | "memagent" | "rememr1" | "rag" | "dci", models=models, **cfg)
    build_method("parser_thinking" | "parser_dci", models=models, episode=..., reader=...)   # Table 5

Each module registers its method on import; configs live in `configs/method/<name>.yaml`.
The alternative ParSer subagents (thinking, DCI) are readers in `parser.readers`; `alt_readers`
names the ParSer variants that use them.
"""
from parser.baselines import alt_readers, dci_agent, full_context, memagent, rag  # noqa: F401  (registration)
