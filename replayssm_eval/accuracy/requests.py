"""What an lm-eval generation request asks of the engine: its stop strings, limit and sampling, and its sample index.

Shared by the lm-eval model (`lm_model`) and the model that answers from a generations file (`recorded`).
"""

from __future__ import annotations

from replayssm_eval.generate.sampling import GEN_KWARGS as SAMPLING_KWARGS
from replayssm_eval.generate.sampling import Sampling

GEN_KWARGS = ("until", "max_gen_toks", *SAMPLING_KWARGS)
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task sets none


def request_kwargs(gen_kwargs: dict) -> dict:
    """until, max_gen_toks and sampling (`Sampling`) of an lm-eval request's generation kwargs; other keys are refused."""
    unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
    if unknown:
        raise ValueError(f"unsupported generation kwargs {', '.join(unknown)}; replayssm accepts {', '.join(GEN_KWARGS)}")
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    return {"until": until, "max_gen_toks": int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)),
            "sampling": Sampling.from_gen_kwargs(gen_kwargs)}


def sample_indices(requests, first: int) -> list[int]:
    """[R] the sample index of each request: `first` + how often the same request (lm-eval's repeats) came before."""
    seen: dict[tuple, int] = {}
    indices = []
    for r in requests:
        key = (r.task_name, r.doc_id, r.idx)
        indices.append(first + seen.get(key, 0))
        seen[key] = seen.get(key, 0) + 1
    return indices
