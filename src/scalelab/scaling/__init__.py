"""Scaling-law studies: fit (Chinchilla approaches 1-3) and report.

`scalelab-fit` and the sweep (planner.py, launch.py, collect.py) build on this API::

    from scalelab.scaling import FitOptions, fit_scaling_laws, write_report
"""

from .fit import (
    Estimate,
    ExtrapolationCheck,
    ScalingResults,
    VariantFit,
    fit_scaling_laws,
    fit_variant,
)
from .fit_data import FitInputError, FitOptions, load_runs_csv, prepare_curves, prepare_runs
from .fit_isoflop import EnvelopeFit, IsoFlopFit, PowerLaw, fit_envelope, fit_isoflop
from .fit_parametric import FlopsPerToken, ParametricFit, fit_parametric, optimal_allocation
from .published_laws import CHINCHILLA, EPOCH_2024
from .report import write_report

__all__ = [
    "CHINCHILLA",
    "EPOCH_2024",
    "EnvelopeFit",
    "Estimate",
    "ExtrapolationCheck",
    "FitInputError",
    "FitOptions",
    "FlopsPerToken",
    "IsoFlopFit",
    "ParametricFit",
    "PowerLaw",
    "ScalingResults",
    "VariantFit",
    "fit_envelope",
    "fit_isoflop",
    "fit_parametric",
    "fit_scaling_laws",
    "fit_variant",
    "load_runs_csv",
    "optimal_allocation",
    "prepare_curves",
    "prepare_runs",
    "write_report",
]
