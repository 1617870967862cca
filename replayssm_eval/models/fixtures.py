"""The tiny trained fixture models bundled with the package, and name resolution.

    tiny-nemotron-h  NemotronHForCausalLM: 5 Mamba-2 + 1 attention + 4 MLP layers, 3.7M parameters
    tiny-qwen3.5     Qwen3_5ForCausalLM (qwen3_5_text): 6 GDN + 2 attention layers, 3.8M parameters
    tiny-kimi-linear KimiLinearForCausalLM: 6 KDA + 2 MLA layers, 3.9M parameters

All are byte-level (replayssm_eval.models.tokenizer), stored in bf16, trained on Shakespeare by
`scripts/train_tiny.py`; each folder's training.json records how, and the held-out bits per byte.

The scoring fixtures answer the synthetic tasks (`replayssm_eval.accuracy.synthetic`), so their accuracy
gaps are real; same architectures, trained on those tasks by `scripts/train_solvers.py`:

    tiny-nemotron-h-solver  the tiny-nemotron-h architecture (Mamba-2)
    tiny-qwen3.5-solver     the tiny-qwen3.5 architecture (GDN)
    tiny-kimi-linear-solver the tiny-kimi-linear architecture (KDA)
"""

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

FIXTURES_DIR = Path(__file__).parent / "fixtures"

BUNDLED_MODELS = ("tiny-nemotron-h", "tiny-qwen3.5", "tiny-kimi-linear")
SCORING_MODELS = ("tiny-nemotron-h-solver", "tiny-qwen3.5-solver", "tiny-kimi-linear-solver")
ACCEPTED = f"a bundled fixture ({', '.join(BUNDLED_MODELS + SCORING_MODELS)}), a local model directory (with config.json) or a hub id"
HUB_PROBE_TIMEOUT_S = 3.0


def resolve_model(name_or_path: str | Path) -> str:
    """A bundled model name -> its folder; anything else unchanged: a local folder stays itself
    and a hub id goes on to `from_pretrained`. Bundled names win over a same-named folder.

    Fails at once (ValueError) where `from_pretrained` would fail only after its hub retries: a
    folder without config.json, a path that does not exist, and a hub id that is not in the local
    HF cache while the hub is off (HF_HUB_OFFLINE) or unreachable.
    """
    name = str(name_or_path)
    if name in BUNDLED_MODELS + SCORING_MODELS:
        folder = FIXTURES_DIR / name
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"bundled model {name!r} is missing its files in {folder}")
        return str(folder)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model {name!r} is a directory without config.json, so not a model; accepted: {ACCEPTED}")
        return name
    if path.exists() or name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ValueError(f"model {name!r} is not a model directory; accepted: {ACCEPTED}")
    if not _in_hub_cache(name):
        unavailable = _hub_unavailable()
        if unavailable:
            raise ValueError(f"model {name!r} is not a bundled fixture, a local directory or in the local hub "
                             f"cache, and {unavailable}; accepted: {ACCEPTED}")
    return name


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local HF cache holds `repo_id`'s config.json (no network)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except HFValidationError as err:
        raise ValueError(f"model {repo_id!r} is not a valid hub id ({err}); accepted: {ACCEPTED}") from err


def _hub_unavailable() -> str | None:
    """Why the hub cannot be asked (offline mode, no connection to its host), or None if it can."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # the hub is reached through a proxy: leave the connection to huggingface_hub
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as err:
        return f"the hub ({host}) is unreachable ({err})"
    return None
