"""Text sources: local .txt/.jsonl/.parquet files in the PG-19 schema, through the datasets code path."""

import json

import pandas as pd
import pytest

from replayssm_eval.data.sources import Document, TextSource, iter_documents

BOOKS = [
    {"short_book_title": "First Book", "publication_date": 1871, "url": "http://example.org/1",
     "text": "It was.\nA\n\nbook."},
    {"short_book_title": "Second", "publication_date": 1902, "url": "http://example.org/2", "text": "Another one."},
]


def _expected(books):
    return [Document(b["short_book_title"], b["text"], b["url"], str(b["publication_date"])) for b in books]


def test_jsonl_and_parquet_in_pg19_schema(tmp_path):
    (tmp_path / "books.jsonl").write_text("".join(json.dumps(b) + "\n" for b in BOOKS))
    pd.DataFrame(BOOKS).to_parquet(tmp_path / "books.parquet")
    for name in ("books.jsonl", "books.parquet"):
        assert list(iter_documents(TextSource(data_files=(str(tmp_path / name),)))) == _expected(BOOKS)


def test_txt_files_are_one_document_each_in_the_given_order(tmp_path):
    (tmp_path / "b.txt").write_text("second\n\nfile\n")
    (tmp_path / "a.txt").write_text("first file")
    docs = list(iter_documents(TextSource(data_files=(str(tmp_path / "b.txt"), str(tmp_path / "a.txt")))))
    assert [(d.title, d.text) for d in docs] == [("b", "second\n\nfile\n"), ("a", "first file")]


def test_glob_is_sorted(tmp_path):
    for name in ("2.txt", "1.txt"):
        (tmp_path / name).write_text(name)
    docs = iter_documents(TextSource(data_files=(str(tmp_path / "*.txt"),)))
    assert [d.text for d in docs] == ["1.txt", "2.txt"]


def test_bundled_text_is_the_default():
    docs = list(iter_documents(TextSource()))
    assert len(docs) >= 2 and all(len(d.text) > 10_000 for d in docs)


@pytest.mark.parametrize(
    "files, message",
    [
        (("missing.txt",), "no such file"),
        (("*.nothing",), "matches no file"),
        (("book.csv",), "unsupported file type '.csv'; known: .txt"),
        (("notext.jsonl",), "no string field 'text'.*short_book_title, publication_date, url, text"),
        (("broken.parquet",), "could not"),
    ],
)
def test_bad_files(tmp_path, monkeypatch, files, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.csv").write_text("text\nhello\n")
    (tmp_path / "notext.jsonl").write_text(json.dumps({"title": "x", "body": "y"}) + "\n")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=message):
        list(iter_documents(TextSource(data_files=files)))


def test_unknown_dataset_and_conflicting_sources():
    with pytest.raises(ValueError, match="unknown dataset 'pg20'; known: pg19"):
        TextSource(dataset="pg20")
    with pytest.raises(ValueError, match="not both"):
        TextSource(dataset="pg19", data_files=("a.txt",))


def test_pg19_goes_through_load_dataset_streaming(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return iter(BOOKS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert list(iter_documents(TextSource(dataset="pg19"))) == _expected(BOOKS)
    assert calls == [("emozilla/pg19", {"streaming": True, "split": "test"})]
