"""The bundled default evaluation text: public-domain Shakespeare plays shipped with the package.

They are the plays held out from training the tiny fixture models (see `scripts/train_tiny.py`),
so a fixture evaluated on them sees text it was not trained on. Titles and Project Gutenberg
sources are in `text/ATTRIBUTION.txt`.
"""

from pathlib import Path

TEXT_DIR = Path(__file__).parent / "text"

# file stems of the plays in text/ (held out from the training plays in the repository's data/shakespeare/);
# the order is the order of `load_bundled_text()`
HELD_OUT_PLAYS = ("macbeth_gut", "tempest_gut", "twelfth_night_gut")

PLAY_SEPARATOR = "\n\n\n"


def bundled_text_paths() -> list[Path]:
    """Paths of the bundled plays, in `HELD_OUT_PLAYS` order."""
    paths = [TEXT_DIR / f"{stem}.txt" for stem in HELD_OUT_PLAYS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"bundled text files missing from the package: {missing}")
    return paths


def load_bundled_text() -> str:
    """All bundled plays as one string, joined by `PLAY_SEPARATOR` (about 317 KB, ASCII)."""
    return PLAY_SEPARATOR.join(p.read_text(encoding="utf-8") for p in bundled_text_paths())
