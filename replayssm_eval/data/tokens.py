"""Tokenised evaluation documents: `num_docs` token sequences of exactly `length` tokens each.

Two ways to reach the length (`pack`):
- "concat": all source documents (those with at least `min_doc_tokens` tokens) joined into one
  stream, with the tokenizer's eos (else sep) token between them, cut into consecutive,
  non-overlapping pieces of `length` tokens. Uses all the text; a piece may span documents.
- "filter": only documents with at least max(`min_doc_tokens`, `length`) tokens, each giving
  its first `length` tokens. One book per piece, as in long-context PG-19 evaluations.

Text is tokenised without special tokens (no BOS is added) and lazily, so a streamed dataset is
read only as far as needed. Running out of text is a ValueError that says how much there was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from replayssm_eval.data.sources import PACK_MODES, Document


@dataclass(frozen=True)
class Span:
    """A run of one source document inside a piece: `num_tokens` tokens from token `start` of `title`."""

    title: str
    url: str
    start: int
    num_tokens: int


@dataclass(frozen=True)
class TokenDocs:
    """The evaluation pieces.

    tokens: [D, length] int64 token ids.
    spans: per piece, the source spans it is made of, in order.
    """

    tokens: torch.Tensor
    spans: list[list[Span]]

    def __len__(self) -> int:
        return self.tokens.shape[0]


def tokenize_documents(
    documents: Iterable[Document],
    tokenizer,
    *,
    num_docs: int,
    length: int,
    pack: str = "concat",
    min_doc_tokens: int = 0,
    source_name: str = "the source",
) -> TokenDocs:
    """Build `num_docs` pieces of `length` tokens from `documents` (see the module docstring)."""
    if pack not in PACK_MODES:
        raise ValueError(f"unknown pack mode {pack!r}; known: {', '.join(PACK_MODES)}")
    if num_docs < 1 or length < 1:
        raise ValueError(f"need num_docs >= 1 and length >= 1, got num_docs={num_docs} length={length}")
    if pack == "concat":
        return _concat(documents, tokenizer, num_docs, length, min_doc_tokens, source_name)
    return _filter(documents, tokenizer, num_docs, length, min_doc_tokens, source_name)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def separator_id(tokenizer) -> int:
    """The token put between concatenated documents: eos, else sep."""
    for name in ("eos_token_id", "sep_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("the tokenizer has neither an eos nor a sep token to join documents; use --pack filter")


def _concat(documents, tokenizer, num_docs, length, min_doc_tokens, source_name) -> TokenDocs:
    sep = separator_id(tokenizer)
    need = num_docs * length
    stream: list[int] = []
    parts: list[tuple[int, Document, int]] = []  # (start in stream, document, tokens taken)
    seen = 0
    for doc in documents:
        ids = _encode(tokenizer, doc.text)
        seen += 1
        if len(ids) < max(min_doc_tokens, 1):
            continue
        if stream:
            stream.append(sep)
        take = min(len(ids), need - len(stream))
        if take > 0:
            parts.append((len(stream), doc, take))
            stream.extend(ids[:take])
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise ValueError(
            f"{source_name} has {len(stream)} tokens in {seen} documents (min {min_doc_tokens} tokens each), "
            f"but {num_docs} documents x {length} tokens (prompt + generated) need {need}; "
            f"lower --tokens, --prompt-len or --num-docs, or add text"
        )
    spans = []
    for piece in range(num_docs):
        lo, hi = piece * length, (piece + 1) * length
        spans.append([
            Span(doc.title, doc.url, max(lo, start) - start, min(hi, start + n) - max(lo, start))
            for start, doc, n in parts
            if start < hi and start + n > lo
        ])
    tokens = torch.tensor(stream[:need], dtype=torch.int64).view(num_docs, length)
    return TokenDocs(tokens=tokens, spans=spans)


def _filter(documents, tokenizer, num_docs, length, min_doc_tokens, source_name) -> TokenDocs:
    rows: list[list[int]] = []
    spans: list[list[Span]] = []
    seen, longest = 0, 0
    for doc in documents:
        ids = _encode(tokenizer, doc.text)
        seen += 1
        longest = max(longest, len(ids))
        if len(ids) < max(min_doc_tokens, length):
            continue
        rows.append(ids[:length])
        spans.append([Span(doc.title, doc.url, 0, length)])
        if len(rows) == num_docs:
            return TokenDocs(tokens=torch.tensor(rows, dtype=torch.int64), spans=spans)
    raise ValueError(
        f"{source_name}: only {len(rows)} of {seen} documents have >= {max(min_doc_tokens, length)} tokens "
        f"(the longest has {longest}), but --num-docs is {num_docs}; "
        f"lower --tokens or --prompt-len, or use --pack concat"
    )
