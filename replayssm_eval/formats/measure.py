"""Round-trip error of state formats on synthetic states: `format_error_table` (used by `formats` and regression tests).

States are [..., H, P, N] in the formats' layout; the model geometries they take their shape from are
`models.presets` (`state_shape`).
"""

from __future__ import annotations

import math

import torch

from replayssm_eval.formats.registry import get_format, list_formats

DISTRIBUTIONS = ("gaussian", "laplace", "student-t3", "ssm")


def sample_state(shape: tuple[int, ...], distribution: str, seed: int) -> torch.Tensor:
    """FP32 test state `[..., H, P, N]`, unit scale.

    gaussian / laplace / student-t3 (heavy-tailed, 3 degrees of freedom): i.i.d. entries.
    ssm: a Mamba-2-like state, sum over 64 decayed rank-1 updates x B^T with per-head decay
    rates and per-head_dim magnitudes spread over two decades (rows and heads of very different size).
    """
    g = torch.Generator().manual_seed(seed)
    if distribution == "gaussian":
        return torch.randn(shape, generator=g)
    if distribution == "laplace":
        u = torch.rand(shape, generator=g) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs()) / math.sqrt(2)
    if distribution == "student-t3":
        z = torch.randn(shape, generator=g)
        chi2 = torch.randn((*shape, 3), generator=g).square().sum(-1)
        return z / torch.sqrt(chi2 / 3) / math.sqrt(3)
    if distribution == "ssm":
        *lead, h, p, n = shape
        t = 64
        decay = torch.exp(-torch.rand((*lead, h, 1, 1), generator=g) * 0.2)  # [..., H, 1, 1]
        weights = decay ** torch.arange(t, 0, -1).view(t, 1)  # [..., H, T, 1]
        x = torch.randn((*lead, h, t, p), generator=g) * 10 ** (2 * torch.rand((*lead, h, 1, p), generator=g) - 1)
        b = torch.randn((*lead, h, t, n), generator=g)
        return torch.einsum("...tp,...tn->...pn", weights * x, b) / math.sqrt(t)
    raise ValueError(f"unknown distribution '{distribution}'; known: {', '.join(DISTRIBUTIONS)}")


def format_error_table(specs: list[str] | None, shape: tuple[int, int, int], distribution: str = "gaussian",
                       seed: int = 0, states: int = 1) -> list[dict]:
    """Per format: bits/element, bytes of one state, relative RMS error and SQNR (dB) on `states` sampled states of
    `shape` (H, P, N)."""
    h, p, n = shape
    x = sample_state((states, h, p, n), distribution, seed)
    rows = []
    for spec in specs or list_formats():
        fmt = get_format(spec)
        y = fmt.quantize(x, seed=seed if fmt.is_stochastic else None)
        rel = ((y - x).double().norm() / x.double().norm()).item()
        rows.append({
            "format": fmt.name,
            "bits_per_element": fmt.bits_per_element,
            "state_bytes": fmt.storage_bytes((h, p, n)),
            "rel_rms_error": rel,
            "sqnr_db": math.inf if rel == 0 else -20 * math.log10(rel),
        })
    return rows
