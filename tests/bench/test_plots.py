"""The experiment's plots: concurrency on a log2 axis (1, 2, 4 ... evenly apart, each labelled),
and the c=N labels of the throughput-vs-speed plot never on top of one another."""

from __future__ import annotations

import itertools

import pytest

plt = pytest.importorskip("matplotlib.pyplot")
from gpuslate.bench import plots  # noqa: E402 - after the skip: matplotlib is an extra


def test_concurrency_on_a_log2_axis_every_level_a_tick() -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    levels = [1, 2, 4, 8, 16, 32, 64, 128]
    ax.plot(levels, [100 * c ** 0.5 for c in levels], label="x")
    plots._axes(ax, levels, "concurrency", "tok/s", "t")
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(c) for c in levels]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    xs = [ax.transData.transform((c, 0))[0] for c in levels]
    gaps = [b - a for a, b in itertools.pairwise(xs)]
    assert max(gaps) - min(gaps) < 1  # evenly apart: 1, 2 and 4 no longer crowd the left edge
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
    assert not any(a.overlaps(b) for a, b in itertools.pairwise(boxes))
    plt.close(fig)


def test_the_labels_of_crowded_points_do_not_collide() -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    # three curves meeting at the left, as baseline and speculative do at high concurrency
    points = [(x, y, f"c={c}", color) for color, base in (("C0", 700), ("C1", 690), ("C2", 710))
              for x, y, c in ((5 + 2 * i, base - 8 * i, 2 ** (7 - i)) for i in range(8))]
    ax.scatter([p[0] for p in points], [p[1] for p in points])
    ax.set_xlim(0, 60)
    ax.set_ylim(0, 800)
    anns = plots.annotate_apart(fig, ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [a.get_window_extent(renderer) for a in anns]
    assert len(anns) == len(points)
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 for b in boxes)
    plt.close(fig)
