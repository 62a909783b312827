"""The tune stage: hyperparameters per size, as Porian et al. (2024) tune them.

At a few sizes of the ``sweep.tune_budgets`` IsoFLOP curves (the points themselves: same N, D,
schedule), up to three rounds of runs are trained one after the other, each round using what the
ones before it fitted (:data:`ROUNDS`):

1. lr (``sweep.tune_lr_factors`` x the rule's lr): per size the parabola optimum in log lr,
   then lr*(N) = coef * N^exponent over the sizes; with two or more tune budgets,
   lr*(N, D) = coef * N^exponent * D^d_exponent (scaling/tune_fit.py says why).
2. batch (``sweep.tune_batch_factors`` x the global batch), every run at lr*(N): per size the
   parabola optimum in log B, then B*(N). D stays the point's D, so the steps change; a factor
   that gives a fractional batch, one the micro batch x devices do not divide, or fewer than
   ``sweep.min_steps`` steps is dropped (and said). Assumption: B* is tuned at lr*(N), which
   was tuned at the base batch (one pass, not a joint lr x B grid).
3. beta2 (``sweep.tune_beta2s``), every run at lr*(N) and B*(N) (the base batch without a batch
   round): the beta2 with the lowest mean loss over the sizes, each relative to its size's best.

Everything is fitted per variant, and :meth:`Plan.with_hparams` puts each variant's values on its
own points. Pure numpy/pandas: the caller (scaling/stage.py) trains, collects and logs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .plan import Plan, PlanPoint
from .sweep_spec import SweepSpec
from .tune_fit import Beta2Choice, PowerLaw, choose_beta2, fit_lr_law, fit_power_law


@dataclass
class VariantTune:
    """What the rounds fitted so far for one variant."""

    lr: PowerLaw | None = None
    batch: PowerLaw | None = None
    beta2: Beta2Choice | None = None

    def hparams(self) -> dict[str, Any]:
        """The form :meth:`Plan.with_hparams` takes."""
        out: dict[str, Any] = {}
        for key in ("lr", "batch"):
            law = getattr(self, key)
            if law is not None:
                out[key] = law.law()
        if self.beta2 is not None:
            out["beta2"] = self.beta2.best
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k).as_dict()
            for k in ("lr", "batch", "beta2")
            if getattr(self, k) is not None
        }


def tune_bases(plan: Plan) -> list[PlanPoint]:
    """The points the rounds run at: ``tune_sizes`` sizes (smallest .. largest, evenly by
    index) of each tune budget's curve, per variant."""
    spec = plan.spec
    budgets = spec.tune_budgets or [min(p.budget for p in plan.points)]
    base = [p for p in plan.points if p.replicate == 0 and p.branch_of is None]
    out = []
    for b in budgets:
        for variant in plan.variants:
            curve = sorted(
                (p for p in base if p.budget == b and p.variant == variant),
                key=lambda p: p.n_params_matmul,
            )
            k = min(spec.tune_sizes, len(curve))
            picks = sorted({round(i * (len(curve) - 1) / max(k - 1, 1)) for i in range(k)})
            out += [curve[i] for i in picks]
    return out


def _as_tune(p: PlanPoint, **changes: Any) -> PlanPoint:
    """A tune-stage run of point ``p``: cosine, no checkpoints for WSD branches."""
    return dataclasses.replace(
        p, stage="tune", save_at_steps=[], schedule="cosine", decay_fraction=None, **changes
    )


def _round_plan(plan: Plan, points: list[PlanPoint]) -> Plan:
    """The runs of one round as a plan of their own: hashed, never replicated."""
    tp = dataclasses.replace(
        plan, points=points, spec=dataclasses.replace(plan.spec, wsd=False, seeds=1)
    )
    tp.finalize()
    return tp


def lr_round(plan: Plan, tuned: dict[str, VariantTune]) -> tuple[Plan, list[str]]:
    """The lr round: every tune size at every lr factor of the rule's lr."""
    out = [
        _as_tune(p, lr=p.lr * f, lr_factor=f, tune_round="lr")
        for p in tune_bases(plan)
        for f in plan.spec.tune_lr_factors
    ]
    return _round_plan(plan, out), []


def _lr_of(p: PlanPoint, tuned: dict[str, VariantTune]) -> dict[str, float]:
    law = tuned[p.variant].lr
    if law is None:
        raise ValueError(f"tune stage: no lr*(N) for variant {p.variant}; the lr round comes first")
    lr = float(law(p.n_params_matmul, p.tokens))
    return {"lr": lr, "lr_factor": lr / p.lr}


def batch_round(plan: Plan, tuned: dict[str, VariantTune]) -> tuple[Plan, list[str]]:
    """Every tune size at every batch factor, at lr*(N), D fixed; the factors a size cannot
    take are dropped, each with a note saying why."""
    spec, q, out, notes = plan.spec, plan.batch_quantum, [], []
    for p in tune_bases(plan):
        for f in spec.tune_batch_factors:
            seqs = f * plan.base_batch
            why = ""
            if abs(seqs - round(seqs)) > 1e-9 or round(seqs) < 1:
                why = f"{seqs:g} sequences is not a whole batch"
            elif round(seqs) % q:
                why = f"{round(seqs)} sequences is not a multiple of {q} (micro batch x devices)"
            else:
                r = plan.at_batch(p, round(seqs))
                if r.steps < spec.min_steps:
                    why = f"{r.steps} steps < sweep.min_steps={spec.min_steps}"
            if why:
                notes.append(
                    f"batch factor {f:g} dropped at N={p.n_params_matmul:,} "
                    f"(C={p.budget:.3g}, variant {p.variant}): {why}"
                )
                continue
            out.append(_as_tune(r, batch_factor=f, tune_round="batch", **_lr_of(p, tuned)))
    return _round_plan(plan, out), notes


def beta2_round(plan: Plan, tuned: dict[str, VariantTune]) -> tuple[Plan, list[str]]:
    """Every tune size at every beta2, at lr*(N) and B*(N) (the base batch if not tuned)."""
    out = []
    for p in tune_bases(plan):
        law = tuned[p.variant].batch
        at = plan.rebatched(p, float(law(p.n_params_matmul, p.tokens))) if law else p
        out += [
            _as_tune(at, beta2=b, tune_round="beta2", **_lr_of(p, tuned))
            for b in plan.spec.tune_beta2s
        ]
    return _round_plan(plan, out), []


@dataclass(frozen=True)
class Round:
    """One round of the tune stage: which grid, how its runs are planned, how they are fitted."""

    name: str  # lr | batch | beta2: the VariantTune field it fills
    key: str  # the SweepSpec key of its grid (empty: the round is off)
    plan: Callable[[Plan, dict[str, VariantTune]], tuple[Plan, list[str]]]
    fit: Callable[[pd.DataFrame], Any]  # one variant's runs of the round -> its result

    def enabled(self, spec: SweepSpec) -> bool:
        return bool(getattr(spec, self.key))


ROUNDS = (
    Round("lr", "tune_lr_factors", lr_round, fit_lr_law),
    Round("batch", "tune_batch_factors", batch_round, lambda r: fit_power_law(r, "batch")),
    Round("beta2", "tune_beta2s", beta2_round, choose_beta2),
)


def active_rounds(spec: SweepSpec) -> list[Round]:
    return [r for r in ROUNDS if r.enabled(spec)]


def preview_rounds(plan: Plan) -> dict[str, Plan]:
    """Each active round's runs before any law is known, for the planner's compute and time
    estimate: their cost does not depend on the lr or beta2, nor on the batch (D is fixed)."""
    placeholder = PowerLaw("lr", coef=plan.spec.lr, exponent=0.0, sizes=pd.DataFrame())
    tuned = {v: VariantTune(lr=placeholder) for v in plan.variants}
    return {r.name: r.plan(plan, tuned)[0] for r in active_rounds(plan.spec)}
