"""Plot layout: Pareto labels placed apart, distinct styles per config in kl_vs_length."""

import itertools

import matplotlib.pyplot as plt

from replayssm_eval.reports.plots import annotate_apart


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
