"""Tokenised evaluation pieces: concatenation with eos, filtering, and running out of text."""

import pytest
import torch

from replayssm_eval.data.sources import Document
from replayssm_eval.data.tokens import Span, tokenize_documents
from replayssm_eval.models.tokenizer import EOS_TOKEN_ID, build_byte_tokenizer

TOKENIZER = build_byte_tokenizer()
DOCS = [Document("a", "abcdefgh"), Document("b", "xy"), Document("c", "0123456789")]


def _ids(text):
    return list(text.encode())


def test_concat_joins_with_eos_and_records_spans():
    out = tokenize_documents(DOCS, TOKENIZER, num_docs=3, length=6)
    stream = _ids("abcdefgh") + [EOS_TOKEN_ID] + _ids("xy") + [EOS_TOKEN_ID] + _ids("0123456789")
    assert torch.equal(out.tokens, torch.tensor(stream[:18]).view(3, 6))
    assert out.spans == [
        [Span("a", "", 0, 6)],
        [Span("a", "", 6, 2), Span("b", "", 0, 2)],  # the eos between them is not a span
        [Span("c", "", 0, 6)],
    ]


def test_concat_skips_short_documents():
    out = tokenize_documents(DOCS, TOKENIZER, num_docs=1, length=12, min_doc_tokens=5)
    assert out.tokens[0].tolist() == _ids("abcdefgh") + [EOS_TOKEN_ID] + _ids("012")


def test_filter_takes_the_start_of_long_documents():
    out = tokenize_documents(DOCS, TOKENIZER, num_docs=2, length=8, pack="filter")
    assert out.tokens.tolist() == [_ids("abcdefgh"), _ids("01234567")]
    assert [s[0].title for s in out.spans] == ["a", "c"]


def test_running_out_of_text_says_how_much_there_is():
    with pytest.raises(ValueError, match=r"has 22 tokens in 3 documents.*2 documents x 20 tokens.*need 40"):
        tokenize_documents(DOCS, TOKENIZER, num_docs=2, length=20)
    with pytest.raises(ValueError, match=r"only 1 of 3 documents have >= 9 tokens \(the longest has 10\)"):
        tokenize_documents(DOCS, TOKENIZER, num_docs=2, length=9, pack="filter")


def test_bad_pack_mode():
    with pytest.raises(ValueError, match="unknown pack mode 'zip'; known: concat, filter"):
        tokenize_documents(DOCS, TOKENIZER, num_docs=1, length=4, pack="zip")
