"""Text sources for evaluation: PG-19 from the hub, local files in the PG-19 schema, the bundled text.

Every source yields `Document`s in a fixed order, and the hub dataset, local files and the
bundled plays go through the same code path (`datasets.load_dataset(..., streaming=True)`), so a
test on local files exercises what a PG-19 run executes. PG-19 schema (`emozilla/pg19`): one row
per book with fields `short_book_title`, `publication_date`, `url`, `text`; only `text` is
required here. A .txt file is one document titled by its file name.

    from replayssm_eval.data.sources import TextSource, iter_documents
    for doc in iter_documents(TextSource(data_files=("books/*.parquet",))): ...
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# --dataset name -> (hub repository, split)
DATASETS = {"pg19": ("emozilla/pg19", "test")}
PACK_MODES = ("concat", "filter")  # how data.tokens cuts documents into pieces
# file extension -> datasets packaged builder, with its options
FILE_BUILDERS = {
    ".txt": ("text", {"sample_by": "document", "keep_linebreaks": True}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}
PG19_FIELDS = ("short_book_title", "publication_date", "url", "text")


@dataclass(frozen=True)
class Document:
    """One book or file: its text and where it came from."""

    title: str
    text: str
    url: str = ""
    publication_date: str = ""


@dataclass(frozen=True)
class TextSource:
    """Where the text comes from: `dataset` (a DATASETS name), `data_files` (paths or globs), or neither (bundled)."""

    dataset: str | None = None
    data_files: tuple[str, ...] = ()

    def __post_init__(self):
        if self.dataset is not None and self.data_files:
            raise ValueError("give --dataset or --data-files, not both")
        if self.dataset is not None and self.dataset not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; known: {', '.join(DATASETS)} (or use --data-files)")

    @property
    def name(self) -> str:
        """Short description for result files and error messages."""
        if self.dataset is not None:
            repo, split = DATASETS[self.dataset]
            return f"{self.dataset} ({repo}, {split} split)"
        if self.data_files:
            return "files " + ", ".join(self.data_files)
        return "bundled text"


def resolve_data_files(patterns: tuple[str, ...]) -> list[Path]:
    """Expand paths and globs in order; every pattern must match an existing file of a known type."""
    paths: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern))) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise ValueError(f"--data-files {pattern!r} matches no file")
        for match in matches:
            path = Path(match).expanduser()
            if not path.is_file():
                raise ValueError(f"--data-files {str(path)!r}: no such file")
            if path.suffix.lower() not in FILE_BUILDERS:
                known = ", ".join(FILE_BUILDERS)
                raise ValueError(f"--data-files {str(path)!r}: unsupported file type {path.suffix!r}; known: {known}")
            paths.append(path)
    return paths


def iter_documents(source: TextSource) -> Iterator[Document]:
    """Documents of `source`, in order, read lazily."""
    if source.dataset is not None:
        repo, split = DATASETS[source.dataset]
        yield from _rows(_open(repo, split=split), source.name, default_title=repo)
    else:
        paths = resolve_data_files(source.data_files) if source.data_files else _bundled_paths()
        for path in paths:
            builder, options = FILE_BUILDERS[path.suffix.lower()]
            rows = _open(builder, data_files=[str(path)], split="train", **options)
            yield from _rows(rows, str(path), default_title=path.stem)


def _open(path: str, **kwargs):
    """`datasets.load_dataset(path, streaming=True, ...)`, with loading failures turned into ValueError."""
    import datasets

    try:
        return datasets.load_dataset(path, streaming=True, **kwargs)
    except Exception as err:  # the hub, the file system and the parsers raise many types
        raise ValueError(f"could not open {path!r} with datasets.load_dataset: {type(err).__name__}: {err}") from err


def _rows(rows, where: str, default_title: str) -> Iterator[Document]:
    index = 0
    iterator = iter(rows)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except Exception as err:  # streaming reads (and parse errors) happen lazily, on iteration
            raise ValueError(f"could not read {where}: {type(err).__name__}: {err}") from err
        text = row.get("text")
        if not isinstance(text, str):
            raise ValueError(
                f"{where} row {index} has no string field 'text' (fields: {', '.join(row) or 'none'}); "
                f"expected the PG-19 schema: {', '.join(PG19_FIELDS)}"
            )
        title = row.get("short_book_title") or (default_title if index == 0 else f"{default_title}[{index}]")
        yield Document(
            title=str(title),
            text=text,
            url=str(row.get("url") or ""),
            publication_date=str(row.get("publication_date") or ""),
        )
        index += 1


def _bundled_paths() -> list[Path]:
    """The bundled plays, one .txt file each, read like `--data-files` (one document per play)."""
    from replayssm_eval.data.bundled import bundled_text_paths

    return bundled_text_paths()
