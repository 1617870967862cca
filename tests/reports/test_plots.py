"""Plot layout: Pareto labels placed apart, distinct styles per config in kl_vs_length, a many-config legend outside."""

import io
import itertools

import matplotlib.pyplot as plt
from PIL import Image

from replayssm_eval.reports.plots import annotate_apart, kl_vs_length_png


def test_labels_of_crowded_points_do_not_overlap():
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    points = [(200 + i, 1e-4 * (1 + 0.01 * i)) for i in range(6)] + [(400, 1e-6), (401, 1e-6)]
    ax.scatter(*zip(*points))
    ax.set_xscale("log")
    ax.set_yscale("log")
    fig.tight_layout()
    texts = annotate_apart(fig, ax, points, [f"nvfp4:scale=head/fp{i}sr" for i in range(len(points))])
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert len(boxes) == len(points)
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    plt.close(fig)


def _report(configs: int) -> dict:
    buckets = [{"start": 2**k, "end": 2 ** (k + 1) - 1, "kl_ci_low": None, "kl_ci_high": None} for k in range(15)]
    return {"configs": [{"name": f"fp32+{i}=nvfp4/fp16sr", "buckets": [dict(b, kl_mean=1e-5 * (i + 1) * (k + 1))
                                                                           for k, b in enumerate(buckets)]}
                        for i in range(configs)],
            "reference": {"name": "fp32"}, "documents_done": 1, "model": "m", "tokens": 32768}


def test_a_legend_of_many_configs_goes_outside_in_columns_without_layout_warnings(recwarn):
    sizes = {}
    for configs in (3, 49):
        png = kl_vs_length_png(_report(configs))
        sizes[configs] = Image.open(io.BytesIO(png)).size
    assert not [w for w in recwarn if "ight layout" in str(w.message)]
    assert sizes[3] == (840, 540)  # 7 x 4.5 in at 120 dpi: the legend inside
    assert sizes[49] == (round((7 + 3 * 2.6) * 120), 580)  # three columns of at most 24 entries beside the axes
