"""The sweep spec and the model family, checked: the planner's keys of ``conf/sweep.yaml``.

``SweepSpec`` (budgets or an N x D grid, the per-size optimisation rule, the tune stage, variants,
WSD, seeds) and ``FamilyConfig`` (which shapes realise a target N) validate themselves when
built, so a bad key fails with one line naming it and the fix before anything is planned.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from scalelab.model.accounting import N_CONVENTIONS

from .laws import read_laws

LR_RULES = ("fixed", "inverse_width")
MODES = ("isoflop", "grid")


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
            require_positive_int(f"sweep.family.{key}", getattr(self, key))
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
            require_positive_int("sweep.family.d_multiple", self.d_multiple)
            if self.d_multiple % self.head_dim:
                raise ValueError(
                    f"sweep.family.d_multiple={self.d_multiple} must be a multiple of "
                    f"head_dim={self.head_dim} so that n_heads = d_model / head_dim is whole")
        if self.min_d_model is not None:
            require_positive_int("sweep.family.min_d_model", self.min_d_model)
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
    # WSD: one run per size with cooldown branches at these fractions of D (plan.py)
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
    # the forecast (scaling/forecast.py): at these multiples of the largest budget, N*, D* and
    # the loss of N*, 2 N* and N*/2, each with a 95 % interval; then (forecast_train) those runs
    # trained and scored against it. [] = no forecast
    forecast_multiples: list[float] = field(default_factory=list)
    forecast_train: bool = True
    # an lr x batch grid (factors of the tuned laws' values) around N* at the first multiple:
    # is the laws' choice as good as the grid's best there? [] = none
    forecast_lr_factors: list[float] = field(default_factory=list)
    forecast_batch_factors: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_targets()
        self._check_rule()
        self._check_tune()
        self._check_variants_and_wsd()
        self._check_forecast()

    def _check_forecast(self) -> None:
        for key in ("forecast_multiples", "forecast_lr_factors", "forecast_batch_factors"):
            values = [float(x) for x in getattr(self, key)]
            if any(not (math.isfinite(x) and x > 0) for x in values) or len(set(values)) < len(values):
                raise ValueError(f"sweep.{key}={getattr(self, key)!r}: distinct positive numbers, "
                                 "or [] for none")
            setattr(self, key, sorted(values))
        if any(m <= 1 for m in self.forecast_multiples):
            raise ValueError(f"sweep.forecast_multiples={self.forecast_multiples!r}: multiples of "
                             "the largest budget, each > 1 (e.g. [10,100]), or [] for no forecast")
        if self.forecast_multiples and self.mode != "isoflop":
            raise ValueError("sweep.forecast_multiples needs sweep.mode=isoflop (it forecasts "
                             "beyond the largest budget); set sweep.forecast_multiples=[]")

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
            require_positive_int("sweep.sizes_per_budget", self.sizes_per_budget)
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
        require_positive_int("sweep.min_steps", self.min_steps)
        require_positive_int("sweep.seeds", self.seeds)
        require_positive_int("sweep.tune_sizes", self.tune_sizes)

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


def require_positive_int(key: str, value: Any) -> None:
    """Fail naming ``key`` unless ``value`` is an int >= 1 (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r}: must be a positive integer")
