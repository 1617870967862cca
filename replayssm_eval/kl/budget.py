"""Mixed precision under a byte budget: per-layer (and per-head) configs that minimise the additive predicted KL.

The choice is over units: an SSM layer as a whole (`4`), or one head of a layer (`4.h2`, the sensitivity
study's --heads layers). Each unit takes one of the candidate configs, or conventional FP32. Its cost is
its state traffic per decode token (`models.traffic`: ReplaySSM bytes of that config on the layer, or on
the head's own part of it; FP32: the conventional read and write of the FP32 state); its predicted KL is
the KL measured when only that unit runs the candidate (the study's `fp32+4=ck` and `fp32+4.h2=ck`
variants; FP32: 0). The prediction of an assignment is the sum over units, and the search is exact: a
dynamic programme over the units that keeps every (bytes, predicted KL) pair no other pair beats on both.
"""

from __future__ import annotations

from replayssm_eval.replay.config import Override, ReplayConfig

FP32 = "fp32"

Unit = int | tuple[int, int]  # an SSM layer, or (layer, head)


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


def unit_name(unit: Unit) -> str:
    """A unit as a mixed config's selector: `4` or `4.h2`."""
    return str(unit) if isinstance(unit, int) else f"{unit[0]}.h{unit[1]}"


def choose(units: list[Unit], costs: dict[Unit, dict[str, float]], predicted: dict[Unit, dict[str, float]],
           budget: float) -> tuple[dict[Unit, str], float, float]:
    """The assignment {unit: candidate name} of least predicted KL whose bytes are within `budget`.

    costs: {unit: {candidate: bytes}} (FP32 included); predicted: {unit: {candidate: KL}} (FP32 0), the same
    candidates. Returns (assignment, predicted KL, bytes). ValueError when even the cheapest assignment exceeds it.
    """
    frontier = [(0.0, 0.0, ())]  # (bytes, predicted KL, choices so far), no pair dominated by another
    for unit in units:
        grown = sorted((b + cost, kl + predicted[unit][c], (*choice, c))
                       for b, kl, choice in frontier for c, cost in costs[unit].items() if b + cost <= budget)
        frontier = []
        for entry in grown:  # ascending bytes: keep an entry only if it lowers the least KL so far
            if not frontier or entry[1] < frontier[-1][1]:
                frontier.append(entry)
        if not frontier:
            cheapest = sum(min(costs[u].values()) for u in units)
            raise ValueError(f"--budget of {budget:.0f} bytes per token is below the cheapest assignment "
                             f"({cheapest:.0f} bytes: every layer and head in its cheapest candidate); accepted: at "
                             "least that")
    total_bytes, kl, choice = min(frontier, key=lambda e: (e[1], e[0]))
    return dict(zip(units, choice)), kl, total_bytes


def mixed_config(assignment: dict[Unit, str]) -> ReplayConfig:
    """The mixed config of an assignment, compactly: each layer's base is its choice (a layer chosen per head: the
    choice of most of its heads), the default is the base of most layers, the other layers are whole-layer parts,
    and the heads whose choice differs from their layer's base are head parts, one per run of adjacent heads."""
    heads: dict[int, dict[int, str]] = {}
    base: dict[int, str] = {}
    for unit, name in assignment.items():
        if isinstance(unit, int):
            base[unit] = name
        else:
            heads.setdefault(unit[0], {})[unit[1]] = name
    for layer, chosen in heads.items():
        base[layer] = _most_used([chosen[h] for h in sorted(chosen)])
    default = _most_used(list(base.values()))
    parts = [Override(layer, ReplayConfig.parse(name)) for layer, name in base.items() if name != default]
    for layer, chosen in heads.items():
        order = sorted(chosen)
        runs: list[list[int]] = []  # runs of adjacent heads with one choice
        for h in order:
            if runs and runs[-1][-1] == h - 1 and chosen[runs[-1][-1]] == chosen[h]:
                runs[-1].append(h)
            else:
                runs.append([h])
        parts += [Override(layer, ReplayConfig.parse(chosen[run[0]]), (run[0], run[-1])) for run in runs
                  if chosen[run[0]] != base[layer]]
    return ReplayConfig.parse(default).replace(overrides=tuple(parts))


def _most_used(names: list[str]) -> str:
    """The most frequent name, the first of them on a tie."""
    return max(dict.fromkeys(names), key=names.count)
