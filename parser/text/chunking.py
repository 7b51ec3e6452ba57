"""Documents and chunking: turn a packed long context into the chunks subagents read.

Packed contexts (HotpotQA / 2Wiki / synthetic world) render paragraph i as
``Document {i}:\\n{title}\\n{text}`` joined by blank lines. We recover those paragraphs and
greedily pack adjacent ones, in order, into chunks of at most ``chunk_size`` tokens of the
subagent's tokenizer (paper Appendix E.4, "Chunking"). A paragraph longer than a chunk is
cut into contiguous token windows, cut at token *character offsets* so no byte is lost.

This module never talks to a model, and nothing here is shown to the lead agent.

    >>> chunks = chunk_document(document, tokenizer, chunk_size=4096)

`release_chunks` chunks as the authors' release does (release train/scripts/parser_dataset.py,
eval/preprocess_eval_data.py; `parser.engine.protocol` picks one of the two): the text is split at every
``Document {i}:`` header that starts a line, each non-empty piece becomes ``Paragraph {i}: {piece}`` (i = the piece's position in the
split, so the pieces keep their document numbers), and pieces are packed while the running
count (piece tokens + 1 per join) stays *below* ``chunk_size``; a piece longer than a chunk is
kept whole (chunk_size <= 0: one piece per chunk).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

PARAGRAPH_SEPARATOR = "\n\n"
# A delimiter counts only at the very start of the text or right after a blank line, so the
# words "Document 3:" inside a paragraph never split it. (Searched as a literal and checked for
# its blank line afterwards: a lookbehind alternation makes the regex ~10x slower on 3 MB texts.)
# ASCII digits only, at most MAX_DOCUMENT_DIGITS of them: `int()` refuses a number over 4,300
# digits (and a file named after a 300-digit number cannot be created), and "Document ３:" must
# not pass for Document 3. A header outside these bounds is text of the paragraph before it.
MAX_DOCUMENT_DIGITS = 9
_DELIMITER = re.compile(rf"Document ([0-9]{{1,{MAX_DOCUMENT_DIGITS}}}):\n")
_RELEASE_DELIMITER = re.compile(r"(?:^|\n)Document\s\d+:\s*")


@dataclasses.dataclass(frozen=True)
class Paragraph:
    index: int | None  # the "Document {i}" number; None for plain text without delimiters
    text: str  # including its "Document {i}:\n" prefix


@dataclasses.dataclass(frozen=True)
class Chunk:
    index: int  # 0-based position of the chunk in the document
    text: str
    paragraph_ids: tuple[int, ...]  # "Document {i}" numbers this chunk holds (or covers a window of)
    num_tokens: int


def render_paragraphs(paragraphs: Sequence[str]) -> str:
    """The packed-context format: ``Document {i}:\\n{paragraph}`` joined by blank lines, i from 1."""
    return PARAGRAPH_SEPARATOR.join(f"Document {i}:\n{p}" for i, p in enumerate(paragraphs, start=1))


def split_paragraphs(document: str) -> list[Paragraph]:
    """Recover the packed paragraphs; a document without delimiters is one plain paragraph."""
    if not document or not document.strip():
        raise ValueError("document is empty: nothing to chunk")
    starts = [
        (m.start(), int(m.group(1)))
        for m in _DELIMITER.finditer(document)
        if m.start() == 0 or document.startswith(PARAGRAPH_SEPARATOR, m.start() - len(PARAGRAPH_SEPARATOR))
    ]
    if not starts:
        return [Paragraph(index=None, text=document)]
    paragraphs = []
    if starts[0][0] > 0:  # preamble before the first delimiter is kept as its own unit
        preamble = document[: starts[0][0]].rstrip("\n")
        if preamble:
            paragraphs.append(Paragraph(index=None, text=preamble))
    for (start, number), nxt in zip(starts, starts[1:] + [(len(document) + len(PARAGRAPH_SEPARATOR), None)], strict=True):
        end = nxt[0] - len(PARAGRAPH_SEPARATOR)
        paragraphs.append(Paragraph(index=number, text=document[start:end]))
    return paragraphs


def _encode_batch(tokenizer: Any, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
    """`tokenizers.Encoding`s for many texts in one (Rust, parallel) call. Token ids and
    offsets stay on the Rust side until asked for: only lengths are needed for most paragraphs."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # HF fast tokenizer -> its Rust core
    if not hasattr(backend, "encode_batch"):
        raise TypeError(f"chunking needs a fast (Rust) tokenizer, got {type(tokenizer).__name__}")
    return backend.encode_batch(texts, add_special_tokens=add_special_tokens)


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(_encode_batch(tokenizer, [text])[0])


def chunk_document(document: str, tokenizer: Any, chunk_size: int) -> list[Chunk]:
    """Greedily pack paragraphs into chunks of at most ``chunk_size`` tokens.

    Each paragraph is tokenized once (batched); chunk sizes are the sum of paragraph and
    separator token counts, so the growing chunk is never re-tokenized.
    """
    if not isinstance(document, str):
        raise TypeError(f"chunk_document: document must be a str, got {type(document).__name__}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    paragraphs = split_paragraphs(document)
    encodings = _encode_batch(tokenizer, [p.text for p in paragraphs])
    separator_tokens = count_tokens(tokenizer, PARAGRAPH_SEPARATOR)

    chunks: list[Chunk] = []
    texts: list[str] = []
    para_ids: list[int] = []
    size = 0

    def flush() -> None:
        nonlocal texts, para_ids, size
        if texts:
            chunks.append(Chunk(len(chunks), PARAGRAPH_SEPARATOR.join(texts), tuple(para_ids), size))
        texts, para_ids, size = [], [], 0

    for paragraph, encoding in zip(paragraphs, encodings, strict=True):
        pid = paragraph.index if paragraph.index is not None else -1
        n = len(encoding)
        if n > chunk_size:  # contiguous token windows, each its own chunk
            flush()
            spans = encoding.offsets
            for lo in range(0, n, chunk_size):
                hi = min(lo + chunk_size, n)
                start = 0 if lo == 0 else spans[lo][0]
                end = len(paragraph.text) if hi == n else spans[hi][0]
                chunks.append(Chunk(len(chunks), paragraph.text[start:end], (pid,), hi - lo))
            continue
        extra = n + (separator_tokens if texts else 0)
        if size + extra > chunk_size:
            flush()
            extra = n
        texts.append(paragraph.text)
        para_ids.append(pid)
        size += extra
    flush()
    return chunks


def release_chunks(document: str, tokenizer: Any, chunk_size: int) -> list[Chunk]:
    """The release's chunking (module docstring); token counts as the release's `encode` makes them."""
    pieces = [(i, f"Paragraph {i}: {part.strip()}") for i, part in enumerate(_RELEASE_DELIMITER.split(document)) if part.strip()]
    if not pieces:
        raise ValueError("document is empty: nothing to chunk")
    sizes = [len(e) for e in _encode_batch(tokenizer, [text for _, text in pieces], add_special_tokens=True)]
    if chunk_size <= 0:
        return [Chunk(n, text, (i,), size) for n, ((i, text), size) in enumerate(zip(pieces, sizes, strict=True))]
    groups: list[list[int]] = [[0]]
    count = sizes[0]
    for k in range(1, len(pieces)):
        if count + sizes[k] < chunk_size:
            groups[-1].append(k)
            count += sizes[k] + 1
        else:
            groups.append([k])
            count = sizes[k] + 1
    return [Chunk(n, PARAGRAPH_SEPARATOR.join(pieces[k][1] for k in group), tuple(pieces[k][0] for k in group),
                  sum(sizes[k] for k in group) + len(group) - 1) for n, group in enumerate(groups)]
