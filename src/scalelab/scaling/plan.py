"""Scaling-sweep planner: compute budgets -> model sizes, token budgets and run settings.

Pure Python on top of ``ModelConfig`` (the single source of truth for N and FLOPs per token):
no Hydra, no MLflow, no torch (except ``measure_flops_per_s``, which imports the model lazily).

IsoFLOP mode (Chinchilla approach 2): for each budget C, K target sizes spaced evenly in log N
around the expected optimum N* (the size for which ``D = C / flops_per_token(N*)`` equals
``tokens_per_param * N*``; 20 is Chinchilla's D ~ 20N), each turned into a concrete shape
(d_model, n_layers) by the family's shape rule, and D chosen so that training FLOPs equal C.
Grid mode: an explicit N x D grid (for the parametric fit).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.model.accounting import N_CONVENTIONS
from scalelab.model.config import ModelConfig
from scalelab.tracking.params import accounting
from scalelab.training.schedules import wsd_decay_start

from .laws import law_value

LR_RULES = ("fixed", "inverse_width")
MODES = ("isoflop", "grid")


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------
@dataclass
class FamilyConfig:
    """Shape rule: which (n_layers, d_model) realise a target parameter count."""

    head_dim: int = 16  # fixed head size; n_heads = d_model / head_dim
    aspect_ratio: float = 32.0  # target d_model / n_layers
    depths: list[int] | None = None  # explicit depths; None -> min..max_layers
    min_layers: int = 1
    max_layers: int = 24
    d_multiple: int | None = None  # d_model is a multiple of this (None -> head_dim)
    min_d_model: int | None = None  # narrowest width (None -> one width step)
    max_d_model: int = 8192

    def __post_init__(self) -> None:
        for key in ("head_dim", "min_layers", "max_layers", "max_d_model"):
            _positive_int(f"sweep.family.{key}", getattr(self, key))
        if not self.aspect_ratio > 0:
            raise ValueError(f"sweep.family.aspect_ratio={self.aspect_ratio!r}: must be > 0")
        if self.min_layers > self.max_layers:
            raise ValueError(
                f"sweep.family.min_layers={self.min_layers} > max_layers={self.max_layers}")
        if self.depths is not None:
            self.depths = [int(x) for x in self.depths]
            if not self.depths or any(x < 1 for x in self.depths):
                raise ValueError(
                    f"sweep.family.depths={self.depths!r}: must be a non-empty list of positive "
                    "ints, or null to use min_layers..max_layers")
        if self.d_multiple is not None:
            _positive_int("sweep.family.d_multiple", self.d_multiple)
            if self.d_multiple % self.head_dim:
                raise ValueError(
                    f"sweep.family.d_multiple={self.d_multiple} must be a multiple of "
                    f"head_dim={self.head_dim} so that n_heads = d_model / head_dim is whole")
        if self.min_d_model is not None:
            _positive_int("sweep.family.min_d_model", self.min_d_model)
            if self.min_d_model > self.max_d_model:
                raise ValueError(f"sweep.family.min_d_model={self.min_d_model} > "
                                 f"max_d_model={self.max_d_model}")

    @property
    def layer_choices(self) -> list[int]:
        if self.depths is not None:
            return sorted(set(self.depths))
        return list(range(self.min_layers, self.max_layers + 1))

    @property
    def width_step(self) -> int:
        return self.d_multiple or self.head_dim

    @property
    def min_multiple(self) -> int:
        """The narrowest width in width steps: min_d_model rounded up to a whole step."""
        return max(1, -(-(self.min_d_model or 0) // self.width_step))


@dataclass
class SweepSpec:
    """Everything the planner needs besides the base model and the batch (conf/sweep/*.yaml)."""

    name: str = "sweep"
    mode: str = "isoflop"  # isoflop | grid
    budgets: list[float] = field(default_factory=list)  # FLOPs per run (isoflop)
    sizes_per_budget: int = 5  # K
    size_span: float = 8.0  # N_max / N_min within one budget
    tokens_per_param: float = 20.0  # prior for the centre of each IsoFLOP curve
    n_convention: str = "matmul"  # which N the size targets and the fits use
    grid_params: list[float] = field(default_factory=list)  # grid mode: target N values
    grid_tokens: list[float] = field(default_factory=list)  # grid mode: D values
    # optimisation rule per size
    lr: float = 1e-3  # peak lr (fixed rule) or lr at base_width (inverse_width rule)
    lr_rule: str = "inverse_width"  # fixed | inverse_width (lr = lr * base_width / d_model)
    base_width: int = 128
    max_lr: float | None = None  # cap for the inverse_width rule
    warmup_tokens_per_param: float = 1.0  # warmup ~ N tokens ...
    max_warmup_fraction: float = 0.1  # ... capped at this fraction of the steps
    min_lr_ratio: float = 0.1  # cosine to 10 %
    beta2: float = 0.99
    # validation
    min_steps: int = 10
    min_tokens_per_param: float = 1.0
    allow_repeat: bool = False  # allow D > train tokens (multiple epochs)
    # variant axis: {key: [values]} crossed; model keys may be given with or without "model."
    variants: dict[str, list[Any]] = field(default_factory=dict)
    # WSD: one run per size with cooldown branches at these fractions of D (see plan_wsd)
    wsd: bool = False
    wsd_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0])
    wsd_decay_fraction: float = 0.2
    # noise: every point trained `seeds` times (seed = base seed + replicate); fits use the mean
    seeds: int = 1
    # tune stage (scaling/tune.py): an lr grid (factors of the rule's lr) at a few sizes of the
    # `tune_budgets` IsoFLOP curves, a power law lr*(N) fitted to the optima, used for every point
    tune_lr_factors: list[float] = field(default_factory=list)  # empty: no tune stage
    tune_budgets: list[float] = field(default_factory=list)  # empty: the smallest budget
    tune_sizes: int = 3  # sizes per tune budget (smallest, middle, largest of its curve)
    # later rounds of the tune stage, run at lr*(N): a batch grid (factors of the global batch,
    # D fixed) -> B*(N), then a beta2 grid at lr*(N) and B*(N) -> one beta2 per variant
    tune_batch_factors: list[float] = field(default_factory=list)  # empty: no batch round
    tune_beta2s: list[float] = field(default_factory=list)  # empty: no beta2 round
    # a measured law lr*(N) = coef * N^exponent [* D^d_exponent] (e.g. from an earlier tune
    # stage's law.json) that sets every point's lr without tuning again; ignored when
    # tune_lr_factors is set
    lr_law: dict[str, float] | None = None
    # an earlier tune stage's law.json: its lr*(N), B*(N) and beta2 for every point of each
    # variant (a study extended to new budgets or sizes keeps the hyperparameters it was tuned
    # with); ignored when tune_lr_factors is set
    laws_from: str | None = None
    # drop the targets below the family's smallest shape, and repeated shapes, instead of
    # failing (tiny budgets whose optimum sits near the smallest model); >= 3 sizes must remain
    clip_sizes: bool = False
    # with clip_sizes: continue a clipped curve's size grid upward (same log spacing) until it
    # has sizes_per_budget distinct shapes again
    fill_sizes: bool = False

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_targets()
        self._check_rule()
        self._check_tune()
        self._check_variants_and_wsd()

    def _check_choices(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"sweep.mode={self.mode!r}: choose one of {', '.join(MODES)}")
        if self.n_convention not in N_CONVENTIONS:
            raise ValueError(
                f"sweep.n_convention={self.n_convention!r}: choose one of {', '.join(N_CONVENTIONS)}")
        if self.lr_rule not in LR_RULES:
            raise ValueError(f"sweep.lr_rule={self.lr_rule!r}: choose one of {', '.join(LR_RULES)}")

    def _check_targets(self) -> None:
        """The budgets (isoflop) or the N and D grid (grid)."""
        self.budgets = [float(c) for c in self.budgets]
        self.grid_params = [float(x) for x in self.grid_params]
        self.grid_tokens = [float(x) for x in self.grid_tokens]
        if self.mode == "isoflop":
            if not self.budgets:
                raise ValueError("sweep.budgets is empty: give compute budgets in FLOPs, "
                                 "e.g. sweep.budgets=[1e12,3e12,1e13]")
            bad = [c for c in self.budgets if not (math.isfinite(c) and c > 0)]
            if bad:
                raise ValueError(f"sweep.budgets has non-positive values {bad}: budgets are FLOPs > 0")
            if len(set(self.budgets)) != len(self.budgets):
                raise ValueError(f"sweep.budgets={self.budgets} has duplicates")
            _positive_int("sweep.sizes_per_budget", self.sizes_per_budget)
            if self.sizes_per_budget > 1 and not self.size_span > 1:
                raise ValueError(f"sweep.size_span={self.size_span!r}: must be > 1 (N_max / N_min)")
        else:
            if not self.grid_params or not self.grid_tokens:
                raise ValueError("sweep.mode=grid needs sweep.grid_params (target N values) and "
                                 "sweep.grid_tokens (D values), e.g. grid_params=[1e5,3e5] "
                                 "grid_tokens=[1e6,4e6]")
            if any(x <= 0 for x in self.grid_params + self.grid_tokens):
                raise ValueError("sweep.grid_params and sweep.grid_tokens must be > 0")

    def _check_rule(self) -> None:
        """The per-size optimisation rule and the run limits."""
        for key in ("tokens_per_param", "lr", "min_tokens_per_param"):
            if not getattr(self, key) > 0:
                raise ValueError(f"sweep.{key}={getattr(self, key)!r}: must be > 0")
        if not 0 <= self.max_warmup_fraction < 1:
            raise ValueError(f"sweep.max_warmup_fraction={self.max_warmup_fraction!r}: must be in [0, 1)")
        if not 0 <= self.beta2 < 1:
            raise ValueError(f"sweep.beta2={self.beta2!r}: must be in [0, 1)")
        _positive_int("sweep.min_steps", self.min_steps)
        _positive_int("sweep.seeds", self.seeds)
        _positive_int("sweep.tune_sizes", self.tune_sizes)

    def _check_tune(self) -> None:
        """The lr tune stage, or a measured lr law."""
        self.tune_lr_factors = [float(x) for x in self.tune_lr_factors]
        self.tune_budgets = [float(x) for x in self.tune_budgets]
        if self.tune_lr_factors and (len(set(self.tune_lr_factors)) < 3
                                     or min(self.tune_lr_factors) <= 0):
            raise ValueError(f"sweep.tune_lr_factors={self.tune_lr_factors!r}: >= 3 distinct "
                             "positive factors of the rule's lr (a parabola needs 3), e.g. "
                             "[0.25,0.5,1,2,4]; [] turns the tune stage off")
        self._check_later_rounds()
        missing = sorted(set(self.tune_budgets) - set(self.budgets))
        if missing and self.mode == "isoflop" and self.tune_lr_factors:
            raise ValueError(f"sweep.tune_budgets has {missing}, which are not in sweep.budgets "
                             f"{self.budgets}: tune at budgets of the study")
        if self.lr_law is not None:
            law = dict(self.lr_law)
            if (not {"coef", "exponent"} <= set(law) <= {"coef", "exponent", "d_exponent"}
                    or not float(law["coef"]) > 0):
                raise ValueError(f"sweep.lr_law={self.lr_law!r}: give {{coef: c, exponent: k}} "
                                 "with c > 0 (lr = c * N^k; d_exponent: q adds * D^q), or null")
            self.lr_law = {k: float(v) for k, v in law.items() if k != "d_exponent" or v}
        if self.laws_from is not None:
            if self.lr_law is not None:
                raise ValueError("sweep.laws_from and sweep.lr_law both set: keep one (laws_from "
                                 "brings the lr law with the batch law and beta2)")
            self.laws_from = str(self.laws_from)
            read_laws(self.laws_from)  # a missing or malformed file fails here, before anything runs
        if self.fill_sizes and not self.clip_sizes:
            raise ValueError("sweep.fill_sizes=true needs sweep.clip_sizes=true (it refills what "
                             "clipping dropped)")

    def _check_later_rounds(self) -> None:
        """The batch and beta2 rounds: grids that make sense, and the lr round they start from."""
        self.tune_batch_factors = [float(x) for x in self.tune_batch_factors]
        self.tune_beta2s = [float(x) for x in self.tune_beta2s]
        if self.tune_batch_factors and (len(set(self.tune_batch_factors)) < 3
                                        or min(self.tune_batch_factors) <= 0):
            raise ValueError(f"sweep.tune_batch_factors={self.tune_batch_factors!r}: >= 3 distinct "
                             "positive factors of the global batch (a parabola needs 3), e.g. "
                             "[0.5,1,2]; [] turns the batch round off")
        if self.tune_beta2s and (len(set(self.tune_beta2s)) < 2
                                 or any(not 0 < b < 1 for b in self.tune_beta2s)):
            raise ValueError(f"sweep.tune_beta2s={self.tune_beta2s!r}: >= 2 distinct values in "
                             "(0, 1), e.g. [0.95,0.99,0.999]; [] turns the beta2 round off")
        for key in ("tune_batch_factors", "tune_beta2s"):
            if getattr(self, key) and not self.tune_lr_factors:
                raise ValueError(f"sweep.{key} needs the lr round (it runs at the tuned lr*(N)): "
                                 "set sweep.tune_lr_factors, e.g. [0.25,0.5,1,2,4], or "
                                 f"sweep.{key}=[]")

    def _check_variants_and_wsd(self) -> None:
        self.variants = {str(k): list(v) for k, v in dict(self.variants or {}).items()}
        for k, v in self.variants.items():
            if not v:
                raise ValueError(f"sweep.variants.{k} is empty: give at least one value")
        if self.wsd:
            fr = [float(x) for x in self.wsd_fractions]
            if not fr or any(not 0 < x <= 1 for x in fr) or max(fr) != 1.0:
                raise ValueError(f"sweep.wsd_fractions={self.wsd_fractions!r}: fractions of D in "
                                 "(0, 1], including 1.0")
            self.wsd_fractions = sorted(set(fr))
            if not 0 < self.wsd_decay_fraction < 1:
                raise ValueError(f"sweep.wsd_decay_fraction={self.wsd_decay_fraction!r}: the final "
                                 "fraction of each run that decays, in (0, 1)")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepSpec:
        """Build from a mapping, taking only the planner's keys (the rest belong to the runner)."""
        return cls(**{k: v for k, v in dict(d).items() if k in cls.field_names()})


def _positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r}: must be a positive integer")


# --------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------
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
    stage: str = "main"  # main | tune (a run of one of the tune stage's grids)
    lr_factor: float = 1.0  # tune stage: this run's lr / the rule's lr
    tune_round: str = ""  # tune stage: lr | batch | beta2 (which grid this run belongs to)
    batch_factor: float = 1.0  # batch round: this run's global batch / the base batch
    beta2: float | None = None  # AdamW beta2 of this run; None: sweep.beta2

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
        """Folder and config name: unique and stable (the hash), never shown as a run name."""
        prefix = "t" if self.stage == "tune" else "p"
        return f"{prefix}{self.index:03d}_{self.point_id[:8]}"

    @property
    def label(self) -> str:
        """The MLflow run name: what tells points apart, e.g. C3e11-N21k, C3e11-N21k-s1."""
        out = f"C{_short(self.budget)}-N{_short(self.n_params_matmul)}"
        if self.variant != "default":
            out += f"-{self.variant}"
        if self.stage == "tune":
            what = {"batch": f"b{self.batch_factor:g}x", "beta2": f"beta2_{self.beta2}"}
            out = f"tune-{out}-" + what.get(self.tune_round, f"lr{self.lr_factor:g}x")
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
            "replicate": self.replicate, "stage": self.stage, "run_name": self.label,
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


def split_variant(variant: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Variant keys -> (ModelConfig fields, other dotted overrides)."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    model, extra = {}, {}
    for key, value in variant.items():
        bare = key.removeprefix("model.")
        if bare in names:
            model[bare] = value
        elif key.startswith("model."):
            raise ValueError(f"sweep.variants.{key}: {bare!r} is not a ModelConfig field; valid "
                             f"fields are {sorted(names)}")
        else:
            extra[key] = value
    return model, extra


def variant_grid(variants: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Cross product of the variant axis -> [(label, {key: value})]; no axis -> [("default", {})]."""
    if not variants:
        return [("default", {})]
    keys = list(variants)
    out = []
    for combo in itertools.product(*(variants[k] for k in keys)):
        assign = dict(zip(keys, combo, strict=True))
        label = ",".join(f"{k.removeprefix('model.')}={v}" for k, v in assign.items())
        out.append((label, assign))
    return out


def shape_for(target_n: float, family: FamilyConfig, base: dict[str, Any],
              convention: str = "matmul", strict: bool = True) -> ModelConfig:
    """The shape of the family closest to ``target_n`` parameters.

    For every allowed depth, the width (a multiple of the family's step) whose N is closest to
    the target in log space; among those, the one minimising
    ``(N error / 20 %)^2 + (aspect error / factor 2)^2`` (both in log space): N is hit closely
    while the shape stays near the rule, which a pure d = aspect * L rule cannot do at tiny
    sizes (there N jumps by ~((L+1)/L)^3 between depths).
    """
    step = family.width_step
    best: tuple[float, ModelConfig] | None = None
    for layers in family.layer_choices:
        cfg = _closest_width(target_n, layers, step, family, base, convention)
        if cfg is None:
            continue
        n_err = abs(math.log(_n_of(cfg, convention) / target_n))
        if strict and n_err > math.log(1.5):  # this depth cannot reach the target
            continue
        aspect_err = abs(math.log((cfg.d_model / layers) / family.aspect_ratio))
        cost = (n_err / 0.2) ** 2 + (aspect_err / math.log(2)) ** 2
        if best is None or cost < best[0]:
            best = (cost, cfg)
    if best is None:
        smallest = _make(family.layer_choices[0], family.min_multiple * step, family, base)
        n_min = _n_of(smallest, convention)
        if target_n < n_min:
            raise ValueError(
                f"target N={target_n:.3g} ({convention}) is too small for the smallest model of "
                f"the family (n_layers={smallest.n_layers}, d_model={smallest.d_model}, "
                f"N={n_min:.3g}). Raise the compute budget, lower sweep.size_span, or lower "
                "sweep.family.head_dim/min_layers/min_d_model")
        raise ValueError(
            f"target N={target_n:.3g} ({convention}) is beyond the largest shape of the family; "
            "raise sweep.family.max_layers/max_d_model or lower the budget")
    return best[1]


_CACHE: dict[tuple, ModelConfig] = {}


def _make(layers: int, d: int, family: FamilyConfig, base: dict[str, Any]) -> ModelConfig:
    key = (layers, d, family.head_dim, tuple(sorted((k, repr(v)) for k, v in base.items())))
    if key not in _CACHE:
        fields_ = dict(base) | {"n_layers": layers, "d_model": d, "n_heads": d // family.head_dim}
        fields_.pop("d_ff", None)  # re-derived from the new width
        if fields_.get("n_kv_heads") is not None and fields_["n_heads"] % fields_["n_kv_heads"]:
            fields_["n_kv_heads"] = None
        _CACHE[key] = ModelConfig.from_dict(fields_)
    return _CACHE[key]


_N_CACHE: dict[tuple[int, str], int] = {}


def _n_of(cfg: ModelConfig, convention: str) -> int:
    key = (id(cfg), convention)  # cfg objects live in _CACHE, so ids are stable
    if key not in _N_CACHE:
        _N_CACHE[key] = N_CONVENTIONS[convention].count(cfg)
    return _N_CACHE[key]


def _closest_width(target_n: float, layers: int, step: int, family: FamilyConfig,
                   base: dict[str, Any], convention: str) -> ModelConfig | None:
    # N grows monotonically with d: bisect on the multiple of `step`.
    lo, hi = family.min_multiple, max(family.min_multiple, family.max_d_model // step)
    if _n_of(_make(layers, lo * step, family, base), convention) >= target_n:
        return _make(layers, lo * step, family, base)
    if _n_of(_make(layers, hi * step, family, base), convention) < target_n:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _n_of(_make(layers, mid * step, family, base), convention) < target_n:
            lo = mid
        else:
            hi = mid
    a, b = _make(layers, lo * step, family, base), _make(layers, hi * step, family, base)
    ea = abs(math.log(_n_of(a, convention) / target_n))
    eb = abs(math.log(_n_of(b, convention) / target_n))
    return a if ea <= eb else b


def optimal_size_prior(budget: float, tokens_per_param: float, family: FamilyConfig,
                       base: dict[str, Any], convention: str = "matmul") -> float:
    """N* with C / flops_per_token(N*) = tokens_per_param * N*.

    flops_per_token is ~6N for big models but more at tiny ones (attention, the output layer),
    so N* is found by bisection in log N, taking flops_per_token from the family's nearest
    shape; the target itself stays continuous, which keeps the equation monotone.
    """
    def excess(log_n: float) -> float:
        cfg = shape_for(math.exp(log_n), family, base, convention, strict=False)
        return math.log(budget / cfg.flops_per_token()) - log_n - math.log(tokens_per_param)

    lo, hi = math.log(10.0), math.log(1e13)
    for _ in range(40):  # 28 e-folds / 2^40: far below the width granularity
        mid = (lo + hi) / 2
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def make_plan(
    spec: SweepSpec,
    family: FamilyConfig,
    base_model: dict[str, Any],
    tokens_per_step: int,
    train_tokens: int | None = None,
    identity: dict[str, Any] | None = None,
    seq_len: int | None = None,
    batch_quantum: int = 1,
) -> Plan:
    """Build and validate the plan. Raises ValueError (naming the budget/point and the fix)
    for a plan that cannot be honoured, before anything runs.

    ``base_model``: ModelConfig fields shared by all points (vocab_size, max_seq_len, arch...).
    ``tokens_per_step``: global batch in tokens. ``train_tokens``: size of the train split (for
    the data-repetition check). ``identity``: extra content that makes two sweeps' points
    differ (e.g. the base train overrides); it enters every point hash. ``batch_quantum``: the
    global batch (sequences) must be a multiple of it (the tune stage's batch round).
    """
    _positive_int("tokens_per_step", tokens_per_step)
    base = {k: v for k, v in dict(base_model).items() if k not in ("d_model", "n_layers", "n_heads")}
    _make(family.layer_choices[0], family.width_step, family, base)  # bad base fields fail here
    seq_len = int(seq_len or base.get("max_seq_len", ModelConfig.max_seq_len))
    points: list[PlanPoint] = []
    for label, assign in variant_grid(spec.variants):
        vmodel, vextra = split_variant(assign)
        vbase = base | vmodel
        _check_mup_lr_rule(spec, vbase)
        if spec.mode == "isoflop":
            for budget in sorted(spec.budgets):
                points += _isoflop_points(spec, family, vbase, tokens_per_step, budget, label,
                                          vmodel, vextra, seq_len)
        else:
            points += _grid_points(spec, family, vbase, tokens_per_step, label, vmodel, vextra,
                                   seq_len)
    for p in points:
        _set_schedule_and_check(p, spec, train_tokens)
    plan = Plan(spec, family, base, tokens_per_step, seq_len, points, train_tokens,
                identity=identity or {}, batch_quantum=int(batch_quantum))
    plan.finalize()
    if spec.lr_law is not None and not spec.tune_lr_factors:
        return plan.with_lr_law(**spec.lr_law)
    if spec.laws_from is not None and not spec.tune_lr_factors:
        laws = read_laws(spec.laws_from)
        missing = [v for v in plan.variants if v not in laws]
        if missing:
            raise ValueError(f"sweep.laws_from={spec.laws_from}: no laws for variant(s) {missing} "
                             f"(the file has {sorted(laws)}); tune them or drop sweep.laws_from")
        return plan.with_hparams({v: laws[v] for v in plan.variants})
    return plan


def read_laws(path: str) -> dict[str, dict[str, Any]]:
    """The per-variant hyperparameters of a tune stage's law.json, in the form
    :meth:`Plan.with_hparams` takes. Raises ValueError naming sweep.laws_from."""
    where = f"sweep.laws_from={path}"
    try:
        variants = json.loads(Path(path).read_text())["variants"]
        out: dict[str, dict[str, Any]] = {}
        for name, laws in variants.items():
            hp: dict[str, Any] = {k: {"coef": float(laws[k]["coef"]),
                                      "exponent": float(laws[k]["exponent"])}
                                  | ({"d_exponent": float(laws[k]["d_exponent"])}
                                     if laws[k].get("d_exponent") else {})
                                  for k in ("lr", "batch") if k in laws}
            if "beta2" in laws:
                hp["beta2"] = float(laws["beta2"]["best"])
            out[str(name)] = hp
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file; give the law.json of an earlier sweep's tune "
                         "stage (sweeps/<name>/tune/law.json)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: not a tune stage's law.json ({type(e).__name__}: {e}); "
                         "expected {\"variants\": {name: {\"lr\": {coef, exponent}, ...}}}") from None
    if not out or not all(hp.get("lr") for hp in out.values()):
        raise ValueError(f"{where}: every variant needs at least an lr law (lr: {{coef, exponent}})")
    return out


def _check_mup_lr_rule(spec: SweepSpec, model: dict[str, Any]) -> None:
    """µP already gives the hidden matrices lr * mup_base_width / d_model; the inverse-width
    rule on top would shrink their lr twice."""
    if model.get("parametrization") == "mup" and spec.lr_rule == "inverse_width":
        raise ValueError(
            "model.parametrization=mup scales the hidden matrices' lr by mup_base_width/d_model "
            "itself; set sweep.lr_rule=fixed (sweep.lr is then the lr tuned at "
            "model.mup_base_width)")


def _point_payload(p: PlanPoint, plan: Plan) -> dict[str, Any]:
    spec = plan.spec
    payload = {"model": p.model_overrides, "extra": p.extra_overrides,
               "tokens": p.tokens, "lr": p.lr, "warmup": p.warmup_steps,
               "min_lr_ratio": spec.min_lr_ratio,
               "beta2": spec.beta2 if p.beta2 is None else p.beta2,
               "base_model": plan.base_model, "identity": plan.identity}
    if p.tokens_per_step != plan.tokens_per_step:  # only then: other points keep their hashes
        payload["tokens_per_step"] = p.tokens_per_step
    if spec.wsd:  # only then: cosine sweeps keep the hashes they always had
        payload["wsd"] = {"decay_fraction": spec.wsd_decay_fraction,
                          "fractions": spec.wsd_fractions}
    if p.stage != "main":
        payload["stage"] = p.stage
    if p.tune_round not in ("", "lr"):  # the lr grid's runs keep the hashes they always had
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


def _point(cfg: ModelConfig, budget: float, tokens: float, tps: int, variant: str,
           vmodel: dict[str, Any], extra: dict[str, Any], size_index: int,
           seq_len: int) -> PlanPoint:
    model_over = {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads}
    model_over |= vmodel
    steps = max(1, round(tokens / tps))
    return PlanPoint(
        variant=variant, budget=budget, n_layers=cfg.n_layers, d_model=cfg.d_model,
        n_heads=cfg.n_heads, **accounting(cfg, seq_len), tokens=steps * tps, steps=steps,
        tokens_per_step=tps, lr=0.0, warmup_steps=0, model_overrides=model_over,
        extra_overrides=dict(extra), size_index=size_index)


def _isoflop_points(spec: SweepSpec, family: FamilyConfig, base: dict[str, Any], tps: int,
                    budget: float, label: str, vmodel: dict[str, Any],
                    extra: dict[str, Any], seq_len: int) -> list[PlanPoint]:
    k = spec.sizes_per_budget
    centre = optimal_size_prior(budget, spec.tokens_per_param, family, base, spec.n_convention)
    half = math.log(spec.size_span) / 2
    targets = [centre * math.exp(-half + 2 * half * i / (k - 1)) if k > 1 else centre
               for i in range(k)]
    shapes = []
    for t in targets:
        try:
            shapes.append(shape_for(t, family, base, spec.n_convention))
        except ValueError as e:
            if spec.clip_sizes and "too small" in str(e):
                continue
            raise ValueError(f"budget C={budget:.3g} (variant {label}): {e}") from None
    if spec.clip_sizes:
        unique: dict[tuple[int, int], ModelConfig] = {}
        for cfg in shapes:
            unique.setdefault((cfg.n_layers, cfg.d_model), cfg)
        if spec.fill_sizes and k > 1:
            _fill_upward(unique, centre * math.exp(half), 2 * half / (k - 1), k, family, base,
                         spec.n_convention)
        shapes = sorted(unique.values(), key=lambda c: _n_of(c, spec.n_convention))
        if len(shapes) < 3:
            raise ValueError(f"budget C={budget:.3g} (variant {label}): sweep.clip_sizes left "
                             f"{len(shapes)} sizes (< 3, no parabola); raise the budget or "
                             "sweep.size_span")
    keys = [(s.n_layers, s.d_model) for s in shapes]
    if len(set(keys)) != len(keys):
        raise ValueError(
            f"budget C={budget:.3g} (variant {label}): the {k} target sizes "
            f"{[f'{t:.3g}' for t in targets]} map to repeated shapes {keys}; the family is too "
            "coarse here. Lower sweep.family.head_dim/d_multiple, raise sweep.size_span, or "
            "raise the budget")
    out = []
    for i, cfg in enumerate(shapes):
        tokens = budget / cfg.flops_per_token(seq_len=seq_len)
        out.append(_point(cfg, budget, tokens, tps, label, vmodel, extra, i, seq_len))
    return out


def _fill_upward(shapes: dict[tuple[int, int], ModelConfig], top: float, log_step: float, k: int,
                 family: FamilyConfig, base: dict[str, Any], convention: str) -> None:
    """Add shapes at targets top * e^(j log_step), j = 1, 2, ... (the grid continued above its
    largest target) until ``shapes`` has k distinct ones; at most 2k tries, and none past the
    family's widest shape."""
    for j in range(1, 2 * k):
        if len(shapes) >= k:
            return
        try:
            cfg = shape_for(top * math.exp(j * log_step), family, base, convention)
        except ValueError:  # beyond the family's largest shape
            return
        shapes.setdefault((cfg.n_layers, cfg.d_model), cfg)


def _grid_points(spec: SweepSpec, family: FamilyConfig, base: dict[str, Any], tps: int,
                 label: str, vmodel: dict[str, Any], extra: dict[str, Any],
                 seq_len: int) -> list[PlanPoint]:
    out = []
    for i, n in enumerate(sorted(spec.grid_params)):
        cfg = shape_for(n, family, base, spec.n_convention)
        for d in sorted(spec.grid_tokens):
            steps = max(1, round(d / tps))
            c = float(cfg.flops_per_token(seq_len=seq_len) * steps * tps)
            out.append(_point(cfg, c, d, tps, label, vmodel, extra, i, seq_len))
    return out


def _set_schedule_and_check(p: PlanPoint, spec: SweepSpec, train_tokens: int | None) -> None:
    """lr and warmup per size, then the checks that make a plan impossible."""
    where = f"point (budget C={p.budget:.3g}, variant {p.variant}, d_model={p.d_model}, " \
            f"n_layers={p.n_layers}, N={p.n_params_matmul:,})"
    if spec.lr_rule == "fixed":
        p.lr = float(spec.lr)
    else:
        p.lr = float(spec.lr) * spec.base_width / p.d_model
        if spec.max_lr is not None:
            p.lr = min(p.lr, float(spec.max_lr))
    p.warmup_steps = warmup_steps(p, spec, p.steps, p.tokens_per_step)
    if p.steps < spec.min_steps:
        raise ValueError(
            f"{where}: only {p.steps} optimizer steps (D={p.tokens:,} tokens at "
            f"{p.tokens_per_step:,} tokens/step) < sweep.min_steps={spec.min_steps}. The budget is "
            "too small for this model: raise the budget or lower the global batch")
    tpp = p.tokens / p.n_params_matmul
    if tpp < spec.min_tokens_per_param:
        raise ValueError(
            f"{where}: D/N = {tpp:.2f} tokens per parameter < sweep.min_tokens_per_param="
            f"{spec.min_tokens_per_param}. The budget is too small for this model: raise the "
            "budget, lower sweep.size_span or sweep.tokens_per_param")
    if train_tokens is not None and p.tokens > train_tokens and not spec.allow_repeat:
        raise ValueError(
            f"{where}: D={p.tokens:,} tokens exceeds the corpus's {train_tokens:,} train tokens "
            f"({p.tokens / train_tokens:.2f} epochs). Use a bigger dataset, lower the budget, or "
            "set sweep.allow_repeat=true to repeat data")


# --------------------------------------------------------------------------------------------
# Wall-time estimate
# --------------------------------------------------------------------------------------------
def measure_flops_per_s(plan: Plan, micro_batch: int, time_budget_s: float = 8.0,
                        threads: int | None = None) -> dict[tuple[int, int, str], float]:
    """Achieved training FLOP/s of each distinct shape: a few forward+backward+AdamW steps.

    Sizes are timed from smallest to largest until ``time_budget_s`` is spent; the rest get
    the FLOP/s of the largest shape measured (larger matmuls are at least as efficient). One
    noisy measurement (a busy machine) is clamped to within 3x of the median.
    """
    import torch
    import torch.nn.functional as F

    from scalelab.model import Transformer

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    shapes: dict[tuple[int, int, str], PlanPoint] = {}
    for p in sorted(plan.points, key=lambda q: q.n_params_matmul):
        shapes.setdefault((p.n_layers, p.d_model, p.variant), p)
    out: dict[tuple[int, int, str], float] = {}
    start, last = time.perf_counter(), None
    try:
        for key, p in shapes.items():
            if last is not None and time.perf_counter() - start > time_budget_s:
                out[key] = last
                continue
            cfg = ModelConfig.from_dict(plan.base_model | p.model_overrides)
            model = Transformer(cfg)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randint(0, cfg.vocab_size, (micro_batch, plan.seq_len))
            times = []
            for i in range(6):
                t0 = time.perf_counter()
                logits = model(x)
                F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if i:  # the first step pays for allocations
                    times.append(time.perf_counter() - t0)
                if i >= 2 and sum(times) > 0.3:
                    break
            dt = sorted(times)[len(times) // 2]
            last = out[key] = p.flops_per_token * micro_batch * plan.seq_len / dt
    finally:
        torch.set_num_threads(old_threads)
    med = sorted(out.values())[len(out) // 2]
    return {k: min(max(v, med / 3), med * 3) for k, v in out.items()}


def estimate_seconds(plan: Plan, flops_per_s: dict[tuple[int, int, str], float],
                     overhead_s: float = 0.0,
                     score_s: dict[tuple[int, int, str], float] | None = None) -> list[float]:
    """Estimated wall time of each point: its own FLOPs / measured FLOP/s + a start-up cost
    (+ the held-out scoring of its checkpoint, ``score_s`` per shape, when the sweep scores)."""
    score_s = score_s or {}
    return [p.cost / flops_per_s[key] + overhead_s + score_s.get(key, 0.0)
            for p in plan.points for key in [(p.n_layers, p.d_model, p.variant)]]
