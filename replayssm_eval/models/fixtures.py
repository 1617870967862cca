"""The tiny trained fixture models bundled with the package, and name resolution.

    tiny-nemotron-h  NemotronHForCausalLM: 5 Mamba-2 + 1 attention + 4 MLP layers, 3.7M parameters
    tiny-qwen3.5     Qwen3_5ForCausalLM (qwen3_5_text): 6 GDN + 2 attention layers, 3.8M parameters
    tiny-kimi-linear KimiLinearForCausalLM: 6 KDA + 2 MLA layers, 3.9M parameters

All are byte-level (replayssm_eval.models.tokenizer), stored in bf16, trained on Shakespeare by
`scripts/train_tiny.py`; each folder's training.json records how, and the held-out bits per byte.
"""

from pathlib import Path

FIXTURES_DIR = Path(__file__).parent / "fixtures"

BUNDLED_MODELS = ("tiny-nemotron-h", "tiny-qwen3.5", "tiny-kimi-linear")


def resolve_model(name_or_path: str | Path) -> str:
    """A bundled model name -> its folder; anything else unchanged: a local folder stays itself
    and a hub id goes on to `from_pretrained`. Bundled names win over a same-named folder."""
    name = str(name_or_path)
    if name in BUNDLED_MODELS:
        folder = FIXTURES_DIR / name
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"bundled model {name!r} is missing its files in {folder}")
        return str(folder)
    return name
