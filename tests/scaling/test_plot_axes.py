"""The report's log axes: a few round ticks whose labels, drawn by matplotlib, do not overlap."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import itertools

import matplotlib.pyplot as plt
import pytest

from scalelab.scaling.plot_axes import MOST_TICKS, legible_log_axes, log_ticks, short_number


@pytest.mark.parametrize(("lo", "hi"), [(2.3, 3.3), (2.5e4, 3.5e5), (3e9, 2.5e11), (9e2, 8e6),
                                        (1e3, 1e15)])
def test_log_axis_labels_are_few_and_do_not_overlap(lo, hi):
    fig, ax = plt.subplots(figsize=(6.5, 4.5))  # the report's loss-vs-tokens size
    try:
        ax.plot([lo, hi], [lo, hi], "o")
        ax.set_xscale("log")
        ax.set_yscale("log")
        legible_log_axes(ax, x=True, y=True)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for axis, horizontal in ((ax.xaxis, True), (ax.yaxis, False)):
            xlo, xhi = sorted(axis.get_view_interval())
            labels = [t.label1 for t in axis.get_major_ticks()
                      if xlo <= t.get_loc() <= xhi and t.label1.get_visible() and t.label1.get_text()]
            assert 2 <= len(labels) <= MOST_TICKS, [t.get_text() for t in labels]
            boxes = sorted((b.x0, b.x1) if horizontal else (b.y0, b.y1)
                           for b in (t.get_window_extent(renderer) for t in labels))
            for (_, end), (start, _) in itertools.pairwise(boxes):
                assert end < start, [t.get_text() for t in labels]
            assert not any(t.label1.get_text() for t in axis.get_minor_ticks())  # minor: unlabelled
    finally:
        plt.close(fig)


def test_ticks_and_labels():
    assert log_ticks(2.5e4, 3.5e5) == [3e4, 5e4, 1e5, 2e5, 3e5]
    assert log_ticks(1e3, 1e15)[:2] == [1e3, 1e6]  # many decades: every k-th one
    assert log_ticks(0, 5) == [] and log_ticks(5, 5) == []
    assert [short_number(v) for v in (3e4, 2.5e5, 1e10, 0.5, 12.0)] == ["3e4", "2.5e5", "1e10", "0.5", "12"]
