"""The sweep plan: one ``PlanPoint`` per training run, and the ``Plan`` that holds them.

A point's id is the hash of what it trains (shape, D, lr, schedule, base config), so a rerun
finds its finished run in MLflow. ``Plan.finalize`` numbers the points, gives them ids, adds the
WSD cooldown branches and the seed replicates; ``with_hparams`` re-makes the plan at tuned
hyperparameters. ``scaling/planner.py`` builds the points from the budgets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.data.files import atomic_write_json, atomic_write_text
from scalelab.model.config import ModelConfig
from scalelab.training.schedules import wsd_decay_start

from .laws import law_value
from .sweep_spec import FamilyConfig, SweepSpec


@dataclass
class PlanPoint:
    """One training run of the sweep."""

    variant: str
    budget: float  # the planned compute C (FLOPs)
    n_layers: int
    d_model: int
    n_heads: int
    n_params: int  # total
    n_params_non_embedding: int
    n_params_matmul: int
    flops_per_token: int  # 6 N_matmul + 12 L T d
    flops_per_token_6n: int  # 6 N_matmul
    tokens: int  # D = steps * tokens_per_step
    steps: int
    tokens_per_step: int
    lr: float
    warmup_steps: int
    model_overrides: dict[str, Any]  # model.* keys of this point (shape + variant model keys)
    extra_overrides: dict[str, Any]  # non-model variant keys
    size_index: int = 0  # position within its IsoFLOP curve (0 = smallest)
    branch_of: str | None = None  # WSD: id of the run whose stable phase it continues
    index: int = 0
    point_id: str = ""
    # WSD (sweep.wsd): schedule of the run, steps where the main run saves stable-phase
    # checkpoints, and for a branch the main run's name and the step it starts from
    schedule: str = "cosine"
    decay_fraction: float | None = None
    save_at_steps: list[int] = field(default_factory=list)
    branch_from: str = ""  # name of the main point (its run folder holds the checkpoint)
    start_step: int = 0
    replicate: int = 0  # seed replicate (sweep.seeds): the run's seed is base seed + replicate
    group_id: str = ""  # point id shared by all replicates of one (N, D, lr, variant) point
    stage: str = "main"  # main | tune (a run of one of the tune stage's grids) | forecast
    lr_factor: float = 1.0  # tune stage: this run's lr / the rule's lr
    tune_round: str = ""  # tune stage: lr | batch | beta2 (which grid this run belongs to)
    batch_factor: float = 1.0  # batch round: this run's global batch / the base batch
    beta2: float | None = None  # AdamW beta2 of this run; None: sweep.beta2
    # forecast stage (scaling/forecast_stage.py): the target's multiple of the largest budget,
    # the run's role (optimum | larger | smaller | grid) and its forecast, tagged at launch
    forecast_multiple: float = 0.0
    forecast_role: str = ""
    forecast_tags: dict[str, str] = field(default_factory=dict)

    @property
    def cost(self) -> int:
        """FLOPs this run itself trains (a WSD branch inherits its first start_step steps)."""
        return self.flops_per_token * (self.steps - self.start_step) * self.tokens_per_step

    @property
    def compute(self) -> int:
        """Training FLOPs actually planned: flops_per_token * tokens."""
        return self.flops_per_token * self.tokens

    @property
    def name(self) -> str:
        """The point's one name: run folder, config, MLflow run, console and report, e.g.
        C3e11-N21k_cb45145f (what tells points apart, then the stable hash of the point).
        Only characters that a folder, a Hydra override and an MLflow name all take as they are."""
        return re.sub(r"[^A-Za-z0-9._+-]", "_", self.label) + f"_{self.point_id[:8]}"

    @property
    def label(self) -> str:
        """What tells points apart, e.g. C3e11-N21k, C3e11-N21k-s1 (the start of ``name``)."""
        out = f"C{_short(self.budget)}-N{_short(self.n_params_matmul)}"
        if self.variant != "default":
            out += f"-{self.variant}"
        if self.stage == "tune":
            what = {"batch": f"b{self.batch_factor:g}x", "beta2": f"beta2_{self.beta2}"}
            out = f"tune-{out}-" + what.get(self.tune_round, f"lr{self.lr_factor:g}x")
        if self.stage == "forecast":
            out = f"forecast{self.forecast_multiple:g}x-{out}"
            if self.forecast_role == "grid":
                out += f"-lr{self.lr_factor:g}x-b{self.batch_factor:g}x"
        if self.replicate:
            out += f"-s{self.replicate}"
        return out

    def optim_overrides(self, min_lr_ratio: float, beta2: float) -> dict[str, Any]:
        d = {"optim.lr": self.lr, "optim.warmup_steps": self.warmup_steps,
             "optim.schedule": self.schedule, "optim.min_lr_ratio": min_lr_ratio,
             "optim.beta2": beta2 if self.beta2 is None else self.beta2}
        if self.schedule == "wsd":
            d["optim.decay_fraction"] = self.decay_fraction
        return d

    def as_row(self) -> dict[str, Any]:
        return {
            "point": self.name, "variant": self.variant, "budget": self.budget,
            "N": self.n_params, "N_non_embedding": self.n_params_non_embedding,
            "N_matmul": self.n_params_matmul, "d_model": self.d_model, "n_layers": self.n_layers,
            "n_heads": self.n_heads, "D": self.tokens,
            "tokens_per_param": self.tokens / self.n_params_matmul, "C": self.compute,
            "steps": self.steps, "tokens_per_step": self.tokens_per_step, "lr": self.lr,
            "beta2": self.beta2, "warmup_steps": self.warmup_steps,
            "replicate": self.replicate, "stage": self.stage, "run_name": self.name,
        } | ({"wsd_branch_of": self.branch_from, "start_step": self.start_step, "cost": self.cost}
             if self.schedule == "wsd" else {})


@dataclass
class Plan:
    spec: SweepSpec
    family: FamilyConfig
    base_model: dict[str, Any]
    tokens_per_step: int
    seq_len: int
    points: list[PlanPoint]
    train_tokens: int | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    lr_law: dict[str, float] | None = None  # lr = coef * N^exponent [* D^q] (sweep.lr_law)
    # sequences the global batch must be a multiple of (micro batch x devices, when set)
    batch_quantum: int = 1
    # per variant, what the tune stage fitted: {"lr": {coef, exponent[, d_exponent]}, "batch":
    # {coef, exponent[, d_exponent]}, "beta2": b} (each optional; laws.law_value)
    tuned: dict[str, dict[str, Any]] | None = None

    def finalize(self) -> None:
        _finalize(self)

    def with_lr_law(self, coef: float, exponent: float, d_exponent: float = 0.0) -> Plan:
        """The plan with every point's peak lr = coef * N_matmul^exponent [* D^d_exponent] (a
        measured law); hashes, branches and replicates rebuilt (new lr, new runs)."""
        law = {"coef": float(coef), "exponent": float(exponent)}
        law |= {"d_exponent": float(d_exponent)} if d_exponent else {}
        out = self.with_hparams({v: {"lr": law} for v in self.variants})
        out.lr_law, out.tuned = law, None
        return out

    def with_hparams(self, laws: dict[str, dict[str, Any]]) -> Plan:
        """The plan with each variant's tuned hyperparameters (see ``tuned``) on its points:
        lr = lr*(N[, D]); global batch = B*(N[, D]) rounded by :func:`round_batch` with the steps
        recomputed from the point's D; AdamW beta2. Hashes, branches, replicates rebuilt."""
        base = [dataclasses.replace(p, save_at_steps=[]) for p in self.points
                if p.replicate == 0 and p.branch_of is None]
        points = []
        for p in base:
            law = laws.get(p.variant, {})
            n, d = p.n_params_matmul, p.tokens
            if "lr" in law:  # no sweep.max_lr cap: that guards the untuned rule; this was measured
                p.lr = float(law_value(law["lr"], n, d))
            if "batch" in law:
                p = self.rebatched(p, float(law_value(law["batch"], n, d)))
            if "beta2" in law:
                p.beta2 = float(law["beta2"])
            points.append(p)
        out = dataclasses.replace(self, points=points, tuned=dict(laws))
        out.finalize()
        return out

    @property
    def base_batch(self) -> int:
        """The configured global batch in sequences."""
        return self.tokens_per_step // self.seq_len

    def rebatched(self, p: PlanPoint, seqs: float) -> PlanPoint:
        """``p`` at a global batch of about ``seqs`` sequences (:func:`round_batch`, capped so
        that at least sweep.min_steps steps remain), D kept: steps and warmup recomputed."""
        q = self.batch_quantum
        most = q * max(1, p.tokens // (self.spec.min_steps * self.seq_len * q))
        return self.at_batch(p, min(round_batch(seqs, q), most))

    def at_batch(self, p: PlanPoint, seqs: int) -> PlanPoint:
        """``p`` at a global batch of ``seqs`` sequences, D kept: steps and warmup recomputed."""
        tps = int(seqs) * self.seq_len
        steps = max(1, round(p.tokens / tps))
        return dataclasses.replace(p, tokens_per_step=tps, steps=steps, tokens=steps * tps,
                                   warmup_steps=warmup_steps(p, self.spec, steps, tps))

    @property
    def variants(self) -> list[str]:
        return sorted({p.variant for p in self.points})

    @property
    def total_compute(self) -> int:
        """FLOPs the sweep trains (WSD branches count only the steps they add)."""
        return sum(p.cost for p in self.points)

    @property
    def main_compute(self) -> int:
        """FLOPs of the points that are not WSD branches."""
        return sum(p.cost for p in self.points if p.branch_of is None)

    def rows(self) -> list[dict[str, Any]]:
        return [p.as_row() for p in self.points]

    def to_dict(self) -> dict[str, Any]:
        return {"spec": dataclasses.asdict(self.spec), "family": dataclasses.asdict(self.family),
                "base_model": self.base_model, "tokens_per_step": self.tokens_per_step,
                "seq_len": self.seq_len, "train_tokens": self.train_tokens,
                "lr_law": self.lr_law, "tuned": self.tuned, "batch_quantum": self.batch_quantum,
                "points": [dataclasses.asdict(p) | {"name": p.name, "compute": p.compute}
                           for p in self.points]}


def _short(x: float) -> str:
    """3e11, 21k, 1.5M: a number in a run name (no dots where a whole number will do)."""
    if x >= 1e9 or x < 1:
        m, e = f"{x:.1e}".split("e")
        m = m.rstrip("0").rstrip(".")
        return f"{m}e{int(e)}"
    for div, suf in ((1e6, "M"), (1e3, "k"), (1, "")):
        if x >= div:
            v = x / div
            return (f"{v:.0f}" if v >= 10 else f"{v:.1f}".rstrip("0").rstrip(".")) + suf
    return f"{x:g}"  # pragma: no cover


def round_batch(seqs: float, quantum: int = 1) -> int:
    """A global batch in sequences: the nearest multiple of ``quantum`` (micro batch x devices,
    which the trainer's batch split requires; 1 when no micro batch is set), at least one."""
    return int(quantum * max(1, round(float(seqs) / quantum)))


def warmup_steps(p: PlanPoint, spec: SweepSpec, steps: int, tokens_per_step: int) -> int:
    """Warmup ~ warmup_tokens_per_param * N tokens, capped at max_warmup_fraction of the steps."""
    warm = math.ceil(spec.warmup_tokens_per_param * p.n_params_matmul / tokens_per_step)
    return max(0, min(warm, int(spec.max_warmup_fraction * steps)))


def point_hash(payload: dict[str, Any]) -> str:
    """Stable id of a run: sha256 of its canonical JSON (sorted keys)."""
    blob = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ModelConfig's defaults: a base-model field at its default stays out of a point's hash, so a
# field added to ModelConfig later (at a default that keeps the old model) keeps every id
_MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)
                   if f.default is not dataclasses.MISSING}


def _point_payload(p: PlanPoint, plan: Plan) -> dict[str, Any]:
    spec = plan.spec
    base = {k: v for k, v in plan.base_model.items()
            if k not in _MODEL_DEFAULTS or v != _MODEL_DEFAULTS[k]}
    payload = {"model": p.model_overrides, "extra": p.extra_overrides,
               "tokens": p.tokens, "lr": p.lr, "warmup": p.warmup_steps,
               "min_lr_ratio": spec.min_lr_ratio,
               "beta2": spec.beta2 if p.beta2 is None else p.beta2,
               "base_model": base, "identity": plan.identity}
    if p.tokens_per_step != plan.tokens_per_step:  # only then: other points keep their hashes
        payload["tokens_per_step"] = p.tokens_per_step
    if spec.wsd:  # only then: a cosine sweep's ids do not depend on the WSD keys
        payload["wsd"] = {"decay_fraction": spec.wsd_decay_fraction,
                          "fractions": spec.wsd_fractions}
    if p.stage != "main":
        payload["stage"] = p.stage
    if p.tune_round not in ("", "lr"):  # the lr grid's ids do not depend on the round
        payload["tune_round"] = p.tune_round
    return payload


def _finalize(plan: Plan) -> None:
    """Hashes, WSD branches and seed replicates of the base points (their lr already set)."""
    spec = plan.spec
    points = [p for p in plan.points if p.replicate == 0 and p.branch_of is None]
    for i, p in enumerate(points):
        p.index = i
        p.save_at_steps = []
        p.point_id = point_hash(_point_payload(p, plan))
    if spec.wsd:
        points += _wsd_branches(points, spec)
    for p in points:
        p.group_id = p.point_id
    n_seeds = spec.seeds if all(p.stage == "main" for p in points) else 1

    def rep_id(pid: str, r: int) -> str:
        return point_hash({"replicate_of": pid, "replicate": r})

    reps = []
    for r in range(1, n_seeds):
        for p in points:  # a replicate differs only by its seed: same N, D, lr, schedule
            reps.append(dataclasses.replace(
                p, replicate=r, save_at_steps=list(p.save_at_steps), point_id=rep_id(p.point_id, r),
                branch_of=rep_id(p.branch_of, r) if p.branch_of else None))
    points += reps
    for i, p in enumerate(points):
        p.index = i
    ids = [p.point_id for p in points]
    if len(set(ids)) != len(ids):
        dup = sorted({p.name for p in points if ids.count(p.point_id) > 1})
        raise ValueError(f"plan has duplicate runs {dup}: two budgets map to the same (N, D); "
                         "space the budgets further apart")
    by_id = {p.point_id: p for p in points}
    for p in points:
        if p.branch_of:
            p.branch_from = by_id[p.branch_of].name
    plan.points = points


def _wsd_branches(mains: list[PlanPoint], spec: SweepSpec) -> list[PlanPoint]:
    """WSD: every point decays over its last wsd_decay_fraction of steps, and for each fraction
    q < 1 of its D a cooldown branch of round(q * steps) steps starts from the point's own
    checkpoint at the step where the branch's decay begins. Up to there the branch's schedule
    (same warmup, same peak lr) equals the main run's, so the branch is exactly a run of q*D
    tokens, at a cost of only its decay steps. Branch budgets are q * the main budget (their
    FLOPs), so the branches of one budget form IsoFLOP curves of their own."""
    f = spec.wsd_decay_fraction
    out: list[PlanPoint] = []
    for m in mains:
        m.schedule, m.decay_fraction = "wsd", f
        for q in spec.wsd_fractions:
            if q >= 1.0:
                continue
            steps = round(m.steps * q)
            start = wsd_decay_start(steps, f, m.warmup_steps)
            if steps < 2 or start <= m.warmup_steps:
                raise ValueError(
                    f"sweep.wsd_fractions: the {q:g} x D branch of {m.name} (budget "
                    f"C={m.budget:.3g}, {m.steps} steps) has {steps} steps and would start its "
                    f"decay at step {start}, inside the {m.warmup_steps}-step warmup. Drop that "
                    "fraction, raise the budget, or lower sweep.max_warmup_fraction")
            b = dataclasses.replace(
                m, budget=m.budget * q, tokens=steps * m.tokens_per_step, steps=steps,
                branch_of=m.point_id, branch_from=m.name, start_step=start, save_at_steps=[],
                point_id=point_hash({"wsd_branch_of": m.point_id, "steps": steps}))
            m.save_at_steps.append(start)
            out.append(b)
    for i, b in enumerate(out, start=len(mains)):
        b.index = i
    return out


def save_plan(plan: Plan, sweep_dir: Path, estimates: list[float] | None = None) -> dict[str, Path]:
    """plan.json + plan.csv in the sweep folder (also logged to the parent run)."""
    import pandas as pd

    sweep_dir.mkdir(parents=True, exist_ok=True)
    rows = plan.rows()
    if estimates is not None:
        for r, s in zip(rows, estimates, strict=True):
            r["est_seconds"] = round(s, 1)
    paths = {"json": sweep_dir / "plan.json", "csv": sweep_dir / "plan.csv"}
    atomic_write_json(paths["json"], plan.to_dict(), default=str)
    atomic_write_text(paths["csv"], pd.DataFrame(rows).to_csv(index=False))
    return paths

