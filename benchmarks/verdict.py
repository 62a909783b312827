"""The bench's targets, the check of its results against them, and its tables."""

from __future__ import annotations

import statistics
from typing import Any

TARGETS = {
    "model/ref": 1.0,  # (2)/(1): scalelab's Transformer as fast as a hand-written model
    "platform/model": 0.90,  # (3)/(2): the whole platform vs the same model in a plain loop
    "time_to_first_step_s": 10.0,  # at most, with the token cache built
    "new/old": 0.9,  # --compare: this checkout's platform vs the other's
}
# (2)/(1) counts as met within the bench's own noise: two models that do the same work measured
# in alternating turns still differ by a few per cent from round to round.
NOISE = {"model/ref": 0.03}
# A sweep point's steps take milliseconds, so fixed per-step costs weigh more there.
PRESET_TARGETS = {("sweep_point", "new/old"): 0.8}


def target(preset: str, key: str) -> float:
    return PRESET_TARGETS.get((preset, key), TARGETS[key])


def median_ratio(rounds: list[dict[str, Any]], num: str, den: str) -> float | None:
    """The median over rounds of each round's num/den: both measured in the same seconds."""
    got = [x[num] / x[den] for x in rounds if x.get(num) is not None and x.get(den)]
    return statistics.median(got) if got else None


def median(rounds: list[dict[str, Any]], key: str) -> float | None:
    got = [x[key] for x in rounds if x.get(key) is not None]
    return statistics.median(got) if got else None


def below(got: float, goal: float) -> str:
    """``got`` to two decimals, or as many more as it takes not to round it up to the target
    it missed (0.996 against 1.0 is not printed "1.00 < 1.0")."""
    places = next((d for d in range(2, 10) if round(got, d) < goal), None)
    return repr(got) if places is None else f"{got:.{places}f}"


def misses(results: list[dict[str, Any]]) -> list[str]:
    """Every figure off its target, one line each."""
    out = []
    for r in results:
        for key in ("model/ref", "platform/model", "new/old"):
            got, goal = r.get(key), target(r["preset"], key)
            if got is not None and got < goal - NOISE.get(key, 0.0):
                noise = f" - {NOISE[key]} noise" if key in NOISE else ""
                out.append(f"{r['preset']}: {key} {below(got, goal)} < {goal}{noise}")
        for key in ("time_to_first_step_s", "new_time_to_first_step_s"):
            t = r.get(key)
            if t is not None and t > TARGETS["time_to_first_step_s"]:
                out.append(f"{r['preset']}: time to first step {t:.1f} s > "
                           f"{TARGETS['time_to_first_step_s']} s")
    return out


def fmt(v: Any, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


Column = tuple[str, str, str]  # title, result key, format ("%" for a share, "s" for seconds)
THREE_SIDES: list[Column] = [
    ("(1) ref", "ref_tokens_per_s", ",.0f"), ("(2) model", "model_tokens_per_s", ",.0f"),
    ("(3) platform", "platform_tokens_per_s", ",.0f"), ("(2)/(1)", "model/ref", ".2f"),
    ("(3)/(2)", "platform/model", ".2f"), ("1st step", "time_to_first_step_s", "s"),
    ("overhead", "overhead_share", "%")]
COMPARE: list[Column] = [
    ("old tok/s", "old_tokens_per_s", ",.0f"), ("new tok/s", "new_tokens_per_s", ",.0f"),
    ("new/old", "new/old", ".2f"), ("old 1st", "old_time_to_first_step_s", "s"),
    ("new 1st", "new_time_to_first_step_s", "s"), ("old val", "old_val_loss", ".4f"),
    ("new val", "new_val_loss", ".4f")]


def cell(v: Any, spec: str) -> str:
    if spec == "%":
        return fmt(None if v is None else 100 * v, ".1f") + "%"
    return fmt(v, ".1f") + "s" if spec == "s" else fmt(v, spec)


def table(results: list[dict[str, Any]], columns: list[Column] = THREE_SIDES) -> str:
    """One row a preset, a column each, right-aligned."""
    widths = [max(9, len(title) + 2) for title, _, _ in columns]
    head = f"{'preset':<17}" + "".join(f"{t:>{w}}" for (t, _, _), w in zip(columns, widths, strict=True))
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(f"{r['preset']:<17}" + "".join(
            f"{cell(r.get(k), spec):>{w}}" for (_, k, spec), w in zip(columns, widths, strict=True)))
    return "\n".join(rows)
