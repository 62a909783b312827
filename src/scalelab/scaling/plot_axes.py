"""Legible log axes for the report's plots: a few labelled ticks with short labels.

Over less than two decades matplotlib labels the minor ticks of a log axis too
(3x10^4 4x10^4 6x10^4 ...), and in a report image scaled to the page they overlap.
"""

from __future__ import annotations

import math

import numpy as np

MOST_TICKS = 6
TICK_SETS = ((1, 2, 3, 5), (1, 2, 5), (1, 3), (1,))  # mantissas per decade, densest first


def short_number(v: float) -> str:
    """3e4, 2.5e5, 0.5, 12: the shortest exact-enough label."""
    return f"{v:.3g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def log_ticks(lo: float, hi: float, most: int = MOST_TICKS) -> list[float]:
    """At most ``most`` round tick positions within [lo, hi] on a log axis."""
    if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo < hi):
        return []
    if hi / lo < 10:  # within a decade: round linear steps read better than 2x10^0, 3x10^0
        from matplotlib.ticker import MaxNLocator

        return [float(t) for t in MaxNLocator(nbins=most - 1).tick_values(lo, hi) if lo <= t <= hi]
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    for subs in TICK_SETS:
        ticks = [m * 10.0**e for e in decades for m in subs if lo <= m * 10.0**e <= hi]
        if len(ticks) <= most:
            return ticks
    return ticks[:: math.ceil(len(ticks) / most)]  # many decades: every k-th one


def legible_log_axes(ax, x: bool = True, y: bool = False) -> None:
    """Call after plotting (the limits must be final): fixed round major ticks with short labels,
    minor ticks unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for on, axis, lim in ((x, ax.xaxis, ax.get_xlim()), (y, ax.yaxis, ax.get_ylim())):
        ticks = log_ticks(*sorted(lim)) if on else []
        if len(ticks) < 2:
            continue
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: short_number(v)))
        axis.set_minor_formatter(NullFormatter())
