"""Mixed precision under a byte budget: per-layer configs that minimise the additive predicted KL.

Each SSM layer L takes one of the candidate configs, or conventional FP32. Its cost is its state
traffic per decode token (`models.traffic`, ReplaySSM bytes per layer and sequence; FP32: the
conventional read and write of the FP32 state); its predicted KL is the KL measured when only L
runs that candidate (the sensitivity study's `fp32+L=ck` variants; FP32: 0). The prediction of an
assignment is the sum over layers, and the search is exact: a dynamic programme over the layers
that keeps every (bytes, predicted KL) pair no other pair beats on both.
"""

from __future__ import annotations

from replayssm_eval.replay.config import Override, ReplayConfig

FP32 = "fp32"


def budget_bytes(text: str, fp32_bytes: float) -> float:
    """`--budget`: bytes of state traffic per decode token (a number > 1), or a fraction of FP32's (0 < f <= 1)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"--budget {text!r} is not a positive number; accepted: bytes of SSM state traffic per decode "
                         "token (e.g. 250000) or a fraction of conventional FP32's (0 < f <= 1, e.g. 0.25)")
    return value * fp32_bytes if value <= 1 else value


def choose(layers: list[int], costs: dict[str, float], predicted: dict[int, dict[str, float]],
           budget: float) -> tuple[dict[int, str], float, float]:
    """The assignment {layer: candidate name} of least predicted KL whose bytes are within `budget`.

    costs: {candidate: bytes per layer} (FP32 included); predicted: {layer: {candidate: KL}} (FP32 0).
    Returns (assignment, predicted KL, bytes). ValueError when even the cheapest assignment exceeds it.
    """
    frontier = [(0.0, 0.0, ())]  # (bytes, predicted KL, choices so far), no pair dominated by another
    for layer in layers:
        grown = sorted((b + costs[c], kl + predicted[layer][c], (*choice, c))
                       for b, kl, choice in frontier for c in costs if b + costs[c] <= budget)
        frontier = []
        for entry in grown:  # ascending bytes: keep an entry only if it lowers the least KL so far
            if not frontier or entry[1] < frontier[-1][1]:
                frontier.append(entry)
        if not frontier:
            cheapest = min(costs.values()) * len(layers)
            raise ValueError(f"--budget of {budget:.0f} bytes per token is below the cheapest assignment "
                             f"({cheapest:.0f} bytes: every layer in its cheapest candidate); accepted: at least that")
    total_bytes, kl, choice = min(frontier, key=lambda e: (e[1], e[0]))
    return dict(zip(layers, choice)), kl, total_bytes


def mixed_config(assignment: dict[int, str]) -> ReplayConfig:
    """The mixed config of an assignment: its most used candidate as the default, the other layers as parts."""
    names = list(assignment.values())
    default = max(dict.fromkeys(names), key=names.count)
    parts = tuple(Override(layer, ReplayConfig.parse(name)) for layer, name in assignment.items() if name != default)
    return ReplayConfig.parse(default).replace(overrides=parts)
