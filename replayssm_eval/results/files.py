"""Result files written atomically, and read back with errors that name the file.

Every file is written to a temporary name in the same folder and moved into place with `os.replace`,
so an interrupted write leaves the previous version (or nothing), never half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """Call `write(file)` on a temporary file beside `path`, then move it into place with `os.replace`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file and `os.replace`."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_json(path: Path, obj) -> None:
    """Write `obj` as indented JSON (non-finite floats must already be replaced: `provenance.finite`)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode())


def read_json(path: Path) -> dict:
    """The JSON object in `path`; ValueError naming the file if it is not valid JSON (e.g. truncated)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); accepted: a JSON file as this tool writes it") from err


def check_output_dir(path: Path, flag: str = "--output") -> Path:
    """`path` unchanged if it is a writable directory or can be created as one (its nearest existing ancestor is
    a writable directory; nothing is created); else a ValueError naming `flag` and the path."""
    path = Path(path)
    accepted = "accepted: a new directory, or an existing one, in a writable place"
    ancestor = path.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        what = "is a file" if ancestor == path.absolute() else f"cannot be created: {ancestor} is a file"
        raise ValueError(f"{flag} {str(path)!r} {what}; {accepted}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r} cannot be written: {ancestor} is not writable (read-only "
                         f"filesystem or permissions); {accepted}")
    return path
