"""The paper's baselines as registered methods, run by the same eval command as ParSer.

    build_method("full_context" | "memagent" | "rememr1" | "rag" | "dci", models=models, **cfg)

Each module registers its method on import; configs live in `configs/method/<name>.yaml`.
The tool-using ones (agentic RAG, the DCI agent) are tool sets (`parser.tools`) run by the one
episode engine. ParSer's alternative subagents (thinking, DCI; paper Table 5) are readers in
`parser.readers`, selected by the `reader` section of `configs/method/parser_{thinking,dci}.yaml`.
"""
from parser.baselines import dci_agent, full_context, memagent, rag  # noqa: F401  (registration)
