"""Start-up: torchmetrics without the optional packages it imports but a training run never uses.

Lightning imports torchmetrics (``lightning_fabric`` compares its version by importing it), and
``import torchmetrics`` imports ``scipy.signal``, ``transformers`` and ``matplotlib`` whenever
they are installed: for an SRMRpy patch, BERTScore/InfoLM/CLIP and ``Metric.plot``. Measured on
a 2-core EPYC (torchmetrics 1.9.0): 3.4-4.0 s, against 0.27 s without them, of a run's ~9 s to
its first step. Upstream: Lightning-AI/torchmetrics#3457 (open; the fix in #3463 was closed).

:func:`install` makes the next ``import torchmetrics`` see those packages as not installed:
its availability flags (``RequirementCache`` objects) answer False, so the modules skip the
imports they guard. Nothing else changes: scalelab, Lightning and user code still import the
real packages (the sweep's fits use scipy, the plots matplotlib, ``scalelab-export``
transformers). Inside that process, torchmetrics' own features that need them (BERTScore,
InfoLM, CLIP scores, ``Metric.plot``) say the package is missing; ``scalelab-train`` therefore
keeps the full import when ``SCALELAB_FULL_TORCHMETRICS=1`` or when a callback outside
Lightning (user code, which may use them) is configured, unless the variable is ``0``.

Imports nothing heavy: it must run before Lightning is loaded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

HIDDEN = ("scipy", "transformers", "matplotlib")  # what torchmetrics imports eagerly
FULL_ENV = "SCALELAB_FULL_TORCHMETRICS"  # "1": the full import; "0": lean even with user callbacks
_FLAGS_MODULE = "torchmetrics.utilities.imports"
NOTICE = (f"hidden from torchmetrics by scalelab for a faster start; set {FULL_ENV}=1 "
          "to use torchmetrics' features that need it")


def _hidden(package: str) -> bool:
    return package.split(".")[0] in HIDDEN


def _hide_flags(module: ModuleType) -> None:
    """Make every availability flag of a hidden package answer False (they are checked lazily
    and cached on the object, so setting ``available`` first decides every later check)."""
    from lightning_utilities.core.imports import RequirementCache
    from packaging.requirements import Requirement

    for flag in list(vars(module).values()):
        if not isinstance(flag, RequirementCache):
            continue
        name = Requirement(flag.requirement).name if flag.requirement else str(flag.module)
        if _hidden(name):
            flag.available = False
            flag.message = f"{name}: {NOTICE}"


class _Loader(importlib.abc.Loader):
    """Runs the real loader; around ``torchmetrics/__init__`` hides the packages from
    ``package_available``, after ``torchmetrics.utilities.imports`` hides its flags."""

    def __init__(self, real: importlib.abc.Loader, name: str) -> None:
        self.real, self.name = real, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.real  # the module looks as if imported the usual way
        if module.__spec__ is not None:
            module.__spec__.loader = self.real
        if self.name == _FLAGS_MODULE:
            self.real.exec_module(module)
            _hide_flags(module)
            return
        import lightning_utilities.core.imports as checks

        real_check = checks.package_available
        checks.package_available = lambda name: not _hidden(name) and real_check(name)
        try:
            self.real.exec_module(module)
        finally:
            checks.package_available = real_check
            uninstall()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name not in ("torchmetrics", _FLAGS_MODULE):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, name)
        return spec


def install() -> bool:
    """Hide :data:`HIDDEN` from the coming ``import torchmetrics``. False (and nothing done)
    when torchmetrics is already imported, when ``SCALELAB_FULL_TORCHMETRICS=1``, or when a
    finder is already installed."""
    if "torchmetrics" in sys.modules or _finder() is not None or _env() == "1":
        return False
    sys.meta_path.insert(0, _Finder())
    return True


def install_for_run(callback_targets: Iterable[str]) -> bool:
    """scalelab-train's rule: lean, unless ``SCALELAB_FULL_TORCHMETRICS=1``, or a callback
    outside Lightning is configured (user code may use BERTScore or ``Metric.plot``) and the
    variable is not ``0`` (which says it does not: the bench's phase timer)."""
    outside = any(not t.startswith(("pytorch_lightning.", "lightning.")) for t in callback_targets)
    if _env() == "1" or (outside and _env() != "0"):
        uninstall()
        return False
    return install()


def _env() -> str:
    return os.environ.get(FULL_ENV, "").strip()


def uninstall() -> None:
    """Remove the finder (once torchmetrics is imported, or when a run needs it whole)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def _finder() -> Any:
    return next((f for f in sys.meta_path if isinstance(f, _Finder)), None)


def torchmetrics_is_lean() -> bool:
    """Whether this process's torchmetrics was imported with :data:`HIDDEN` hidden."""
    flags = sys.modules.get(_FLAGS_MODULE)
    flag = getattr(flags, "_MATPLOTLIB_AVAILABLE", None)
    return flag is not None and NOTICE in str(getattr(flag, "message", ""))
