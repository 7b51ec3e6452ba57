"""Chunking invariants. Run: .venv/bin/pytest tests/test_chunking_on_cpu.py -q"""
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parser.text.chunking import chunk_document, count_tokens, render_paragraphs, split_paragraphs


def _paragraphs(chunks):
    """Rebuild the document: windows of one long paragraph (consecutive chunks holding the same
    single paragraph) join directly; separate chunks join with the paragraph separator."""
    text = chunks[0].text
    for previous, chunk in itertools.pairwise(chunks):
        same_paragraph = len(chunk.paragraph_ids) == 1 and chunk.paragraph_ids == previous.paragraph_ids
        text += ("" if same_paragraph else "\n\n") + chunk.text
    return text


def test_split_recovers_paragraphs_and_ignores_inline_delimiters():
    paragraphs = ["Alpha\nFirst text.", "Beta\nIt cites Document 3: inline, which must not split.", "Gamma\nLast."]
    parts = split_paragraphs(render_paragraphs(paragraphs))
    assert [p.index for p in parts] == [1, 2, 3]
    assert [p.text.split("\n", 1)[1] for p in parts] == paragraphs


def test_plain_text_falls_back_to_one_unit_and_empty_input_errors():
    assert [p.index for p in split_paragraphs("just some text")] == [None]
    with pytest.raises(ValueError, match="empty"):
        chunk_document("   ", None, 10)


def test_chunks_respect_size_and_keep_every_paragraph_once_in_order(qwen3_tokenizer):
    paragraphs = [f"Title {i}\n" + "word " * (i * 7 % 90 + 3) for i in range(60)]
    document = render_paragraphs(paragraphs)
    chunks = chunk_document(document, qwen3_tokenizer, 128)
    assert _paragraphs(chunks) == document  # nothing lost, nothing duplicated, order kept
    for chunk in chunks:
        assert count_tokens(qwen3_tokenizer, chunk.text) <= 128
        assert chunk.num_tokens <= 128
    ids = [pid for c in chunks for pid in c.paragraph_ids]
    assert ids == sorted(ids) and set(ids) == set(range(1, 61))


def test_long_paragraph_is_cut_into_contiguous_windows(qwen3_tokenizer):
    long_text = "Long\n" + " ".join(f"tok{i}" for i in range(400))
    document = render_paragraphs(["Short\nsmall.", long_text, "After\nend."])
    chunks = chunk_document(document, qwen3_tokenizer, 64)
    windows = [c for c in chunks if c.paragraph_ids == (2,)]
    assert len(windows) > 3
    assert "".join(w.text for w in windows) == "Document 2:\n" + long_text
    assert all(w.num_tokens <= 64 for w in chunks)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=300), min_size=1, max_size=25),
    chunk_size=st.integers(min_value=8, max_value=200),
)
def test_property_lossless_and_bounded(qwen3_tokenizer, texts, chunk_size):
    texts = [t.replace("\n\nDocument", "\n\nDoc") for t in texts]
    document = render_paragraphs(texts)
    chunks = chunk_document(document, qwen3_tokenizer, chunk_size)
    assert _paragraphs(chunks) == document
    assert all(c.num_tokens <= chunk_size for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_896k_token_document_chunks_within_bounds(qwen3_tokenizer):
    """Scale check only; its speed is measured by scripts/bench_chunking.py (timed tests flake)."""
    paragraph = "Some Title\n" + "The quick brown fox jumps over the lazy dog near the river bank. " * 10
    document = render_paragraphs([paragraph] * 6400)  # ~900K tokens
    chunks = chunk_document(document, qwen3_tokenizer, 4096)
    assert sum(c.num_tokens for c in chunks) > 800_000
    assert all(c.num_tokens <= 4096 for c in chunks)
    assert [pid for c in chunks for pid in c.paragraph_ids] == list(range(1, 6401))


@pytest.mark.parametrize("document", [None, b"bytes are not text", 42, ["a", "b"], {"context": "x"}])
def test_a_document_that_is_not_text_is_refused_naming_the_argument(qwen3_tokenizer, document):
    with pytest.raises(TypeError, match=f"document must be a str, got {type(document).__name__}"):
        chunk_document(document, qwen3_tokenizer, 128)
