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


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def median_ratio(rounds: list[dict[str, Any]], num: str, den: str) -> float | None:
    """The median over rounds of each round's num/den: both measured in the same seconds."""
    got = [r for r in (ratio(x.get(num), x.get(den)) for x in rounds) if r is not None]
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


def table(results: list[dict[str, Any]]) -> str:
    """Tokens/s of the three sides, the ratios, first step and the overhead share."""
    head = (f"{'preset':<17}{'(1) ref':>10}{'(2) model':>11}{'(3) platform':>14}{'(2)/(1)':>9}"
            f"{'(3)/(2)':>9}{'1st step':>10}{'overhead':>10}")
    rows = [head, "-" * len(head)]
    for r in results:
        ovh = r.get("overhead_share")
        rows.append(f"{r['preset']:<17}{fmt(r.get('ref_tokens_per_s')):>10}"
                    f"{fmt(r.get('model_tokens_per_s')):>11}{fmt(r.get('platform_tokens_per_s')):>14}"
                    f"{fmt(r.get('model/ref'), '.2f'):>9}{fmt(r.get('platform/model'), '.2f'):>9}"
                    f"{fmt(r.get('time_to_first_step_s'), '.1f'):>9}s"
                    f"{fmt(None if ovh is None else 100 * ovh, '.1f'):>9}%")
    return "\n".join(rows)


def compare_table(results: list[dict[str, Any]]) -> str:
    """Old and new platform side by side: tokens/s, new/old, first step, final val loss."""
    head = (f"{'preset':<17}{'old tok/s':>11}{'new tok/s':>11}{'new/old':>9}{'old 1st':>9}"
            f"{'new 1st':>9}{'old val':>9}{'new val':>9}")
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(f"{r['preset']:<17}{fmt(r.get('old_tokens_per_s')):>11}"
                    f"{fmt(r.get('new_tokens_per_s')):>11}{fmt(r.get('new/old'), '.2f'):>9}"
                    f"{fmt(r.get('old_time_to_first_step_s'), '.1f'):>8}s"
                    f"{fmt(r.get('new_time_to_first_step_s'), '.1f'):>8}s"
                    f"{fmt(r.get('old_val_loss'), '.4f'):>9}{fmt(r.get('new_val_loss'), '.4f'):>9}")
    return "\n".join(rows)
