"""A sensitivity study's report blocks, from its sensitivity.json: the ranked layer table, the heat maps and the
budget's choice (its configs, and unit by unit).

Heat maps: layer x length bucket, and layer x head (`--heads`), each in two panels: the KL when only
that part uses the config (the rest FP32) and when only that part stays FP32 (the rest in the config).
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from replayssm_eval.reports.load import Result  # noqa: E402
from replayssm_eval.reports.plots import _png  # noqa: E402
from replayssm_eval.reports.tables import KIB, Table, _bucket, _sci  # noqa: E402

PANELS = (("only", "only this part in {config}"), ("all_but", "only this part in FP32, the rest in {config}"))


def ranked_table(result: Result) -> Table:
    """Rows: SSM layers, most sensitive first; columns: the two variants' mean KL and their KL per bucket."""
    d = result.data
    buckets = [_bucket({"start": s, "end": e}) for s, e in d["buckets"]]
    rows = []
    for row in sorted(d["layers"], key=lambda r: r["rank"]):
        only, rest = row["only"], row["all_but"]
        share = only["kl_mean"] / d["uniform"]["kl_mean"] if d["uniform"]["kl_mean"] else None
        rows.append([str(row["rank"]), str(row["layer"]), _sci(only["kl_mean"]),
                     "–" if share is None else f"{100 * share:.1f}%", _sci(rest["kl_mean"]),
                     " · ".join(_sci(v) for v in only["buckets"])])
    additive = d["additive"]
    note = (f"Mean KL(p_fp32 || p_variant), nats/token, over {d['num_docs']} documents x {d['tokens']} tokens. "
            f"'only L' runs layer L in {d['config']} and every other SSM layer in FP32; 'all but L' the reverse. "
            f"Share: only-L KL over the KL of {d['config']} everywhere ({_sci(d['uniform']['kl_mean'])}). "
            f"The only-L KLs sum to {_sci(additive['sum_only'])}"
            + (f", {additive['ratio']:.2f}x the uniform KL (1.00 when the layers' errors add)." if additive["ratio"]
               else "."))
    if not d.get("complete", True):
        note += " INCOMPLETE: the study was interrupted; these are the stages done so far."
    return Table(f"Layer sensitivity of {d['config']}, {result.label}",
                 ["rank", "layer", "KL only L", "share", "KL all but L", f"KL only L per bucket ({', '.join(buckets)})"],
                 rows)


def heads_table(result: Result) -> Table | None:
    """Rows: (layer, head) of the heads stage, most sensitive first."""
    heads = result.data["heads"]
    if not heads:
        return None
    rows = [[str(h["layer"]), str(h["head"]), _sci(h["only"]["kl_mean"]), _sci(h["all_but"]["kl_mean"])]
            for h in sorted(heads, key=lambda h: h["only"]["kl_mean"], reverse=True)]
    sums = [f"layer {a['layer']}: {a['ratio']:.2f}x" for a in result.data["additive"].get("heads", []) if a["ratio"]]
    note = ("How well per-head KLs add up: the only-this-head KLs of a layer summed, over that layer's only-L KL (1.00 "
            f"when its heads' errors add): {', '.join(sums)}." if sums else "")
    return Table(f"Head sensitivity of {result.data['config']}, {result.label}",
                 ["layer", "head", "KL only this head", "KL all but this head"], rows, note=note)


def budget_table(result: Result) -> Table | None:
    """The --budget choice: its per-layer configs, predicted and measured KL, beside every candidate uniformly."""
    plan = result.data.get("budget")
    if not plan:
        return None
    fp32 = plan["fp32_bytes"]
    rows = [["chosen: " + plan["config"], f"{plan['chosen_bytes'] / KIB:.1f}", f"{100 * plan['chosen_bytes'] / fp32:.1f}%",
             _sci(plan["predicted_kl"]), _sci(plan["measured_kl"])]]
    rows += [[u["name"], f"{u['bytes'] / KIB:.1f}", f"{100 * u['bytes'] / fp32:.1f}%", "", _sci(u["kl_mean"])]
             for u in plan["uniform"]]
    ratio = plan["measured_over_predicted"]
    per_head = any(u["head"] is not None for u in plan.get("units", []))
    measured_bytes = plan.get("measured_bytes")
    note = (f"Budget {plan['given']} = {plan['bytes'] / KIB:.1f} KiB of SSM state traffic per decode token "
            f"(conventional FP32: {fp32 / KIB:.1f} KiB). Predicted KL: the sum over "
            + ("layers and the heads of the --heads layers" if per_head else "layers")
            + " of the KL measured with only that unit in its chosen config (FP32: 0); measured: the chosen config's "
            "own kl run (the stage budget/, whose Pareto plot shows it beside the uniform candidates)"
            + (f"; measured / predicted = {ratio:.2f}." if ratio else "; not measured yet.")
            + (f" The chosen bytes are the units' sum; the traffic model counts the chosen config at "
               f"{measured_bytes / KIB:.1f} KiB (heads in one part share their groups' buffered rows)."
               if measured_bytes is not None and not math.isclose(measured_bytes, plan["chosen_bytes"]) else ""))
    return Table(f"Mixed precision under a budget, {result.label}",
                 ["config", "KiB / token", "of FP32", "predicted KL", "measured KL"], rows, note=note)


def budget_units_table(result: Result) -> Table | None:
    """The --budget choice unit by unit: each SSM layer, or each head of a layer chosen per head."""
    plan = result.data.get("budget")
    if not plan or not plan.get("units"):
        return None
    names = plan["candidates"]
    rows = [[u["unit"], u["choice"], f"{u['bytes'][u['choice']] / KIB:.2f}", _sci(u["predicted_kl"][u["choice"]]),
             " · ".join(_sci(u["predicted_kl"][name]) for name in names)] for u in plan["units"]]
    note = ("A unit is an SSM layer (L) or one head of a layer chosen per head (L.hH, the --heads layers); its bytes "
            "are the traffic model's for that layer or for that head's own part, and its predicted KL the KL measured "
            "with only it in a candidate, the rest FP32.")
    return Table(f"Budget choice per layer and head, {result.label}",
                 ["unit", "choice", "KiB / token", "predicted KL", f"predicted KL of {', '.join(names)}"], rows,
                 note=note, align=["l", "l", "r", "r", "r"])


def layer_heatmap_png(result: Result) -> bytes:
    """Layer x length bucket, two panels (`PANELS`)."""
    d = result.data
    layers = sorted(d["layers"], key=lambda r: r["layer"])
    grids = [np.array([row[key]["buckets"] for row in layers], dtype=float) for key, _ in PANELS]  # [layers, buckets]
    labels = [_bucket({"start": s, "end": e}) for s, e in d["buckets"]]
    return _heatmaps(grids, [str(r["layer"]) for r in layers], labels, "generated tokens (bucket)", d["config"],
                     result.label)


def head_heatmap_png(result: Result) -> bytes | None:
    """Layer x head of the heads stage, two panels; heads of layers not measured stay blank."""
    heads = result.data["heads"]
    if not heads:
        return None
    layers = sorted({h["layer"] for h in heads})
    width = max(h["head"] for h in heads) + 1
    grids = []
    for key, _ in PANELS:
        grid = np.full((len(layers), width), np.nan)  # [layers, heads]
        for h in heads:
            grid[layers.index(h["layer"]), h["head"]] = h[key]["kl_mean"]
        grids.append(grid)
    return _heatmaps(grids, [str(layer) for layer in layers], [str(h) for h in range(width)], "head",
                     result.data["config"], result.label)


def _heatmaps(grids: list[np.ndarray], rows: list[str], cols: list[str], xlabel: str, config: str, title: str) -> bytes:
    """The two panels side by side, each with its own log colour scale (blank: KL 0 or not measured)."""
    width = min(16.0, max(8.0, 3.0 + 0.5 * len(cols)))
    fig, axes = plt.subplots(1, 2, figsize=(width, 1.8 + 0.35 * len(rows)), dpi=110)
    for ax, grid, (_, caption) in zip(axes, grids, PANELS):
        shown = np.where(grid > 0, grid, np.nan)
        finite = shown[np.isfinite(shown)]
        norm = LogNorm(finite.min(), finite.max()) if finite.size and finite.min() < finite.max() else None
        image = ax.imshow(shown, aspect="auto", cmap="viridis", norm=norm)
        ax.set_xticks(range(len(cols)), cols, rotation=60 if len(cols) > 8 else 0, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("SSM layer")
        ax.set_title(caption.format(config=config), fontsize=8)
        fig.colorbar(image, ax=ax, label="mean KL, nats/token")
    fig.suptitle(title, fontsize=9)
    return _png(fig)
