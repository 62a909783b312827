"""A markdown table of a DataFrame, for the sweep's reports."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .fit import Estimate


def md_table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    def cell(v) -> str:
        if isinstance(v, Estimate):
            return v.fmt(4)
        if isinstance(v, float | np.floating):
            return "" if math.isnan(v) else format(float(v), floatfmt)
        return str(v)

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)
