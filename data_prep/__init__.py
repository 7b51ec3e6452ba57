"""Long-context QA data: pack multi-hop questions into long documents, in the paper's recipes.

Every source (HotpotQA, FlashRAG 2WikiMultiHopQA, MemAgent's released eval files, the
offline synthetic world) is read into the same `Question` + `Corpus` pair
(`data_prep.records`), packed by one function (`data_prep.packing`) and written in two forms:
eval rows (JSON/JSONL, MemAgent's fields plus our evidence metadata) and verl's RL parquet
(`data_prep.verl_parquet`). Entry point with Hydra configs under ``configs/data/``:

    parser data --config-name synthetic_eval
    parser data --config-name hotpotqa_eval out_dir=data/hqa_val

The one-call helper for CI, the demo and eval tests:

    >>> from data_prep import build_synthetic_eval
    >>> rows = build_synthetic_eval(num_questions=8, lengths=(50, 100), seed=0)
"""
from data_prep.synthetic_world import build_synthetic_eval

__all__ = ["build_synthetic_eval"]
