"""Process-wide settings before a run is built: CPU precision check, threads, matmul precision,
seeds, and a Lightning that reports only what matters into train.log."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from scalelab.config.spec import RunSpec
from scalelab.runtime import concurrent_processes, thread_plan


class _DropNoise(logging.Filter):
    """Lightning start-up chatter that says nothing about this run."""

    NOISE = ("litlogger", "GPU available", "TPU available", "`weights_only` was not set",
             "HPU available", "LOCAL_RANK:",
             # routine lines of every run (the banner says precision, steps, resume point)
             "Automatic Mixed Precision", "`Trainer.fit` stopped", "was configured so",
             "Restoring states from the checkpoint", "Restored all states from the checkpoint")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(n in msg for n in self.NOISE)


def verbose() -> bool:
    """`scalelab-train -v` (hydra.verbose=true): Lightning's routine lines stay on."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized() and bool(HydraConfig.get().verbose)


def quiet_lightning() -> None:
    import warnings

    if verbose():
        return
    # on every resume: the folder is the run's own; on any host with srun installed
    warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message=r".*The `srun` command is available on your system")
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                 "pytorch_lightning.trainer.connectors.checkpoint_connector"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in lg.filters):
            lg.addFilter(_DropNoise())
    # our IterableDataset streams are single-process and sized on purpose
    warnings.filterwarnings("ignore", message=r".*IterableDataset.*has `__len__` defined")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # Lightning only asks whether the DataLoader object is `_Stateful`; our DataModules save
    # and restore the exact stream position themselves (DataModule.state_dict in
    # data/datamodules.py, stored in every checkpoint), so a mid-epoch resume is exact.
    warnings.filterwarnings("ignore", message=r".*dataloader is not resumable")
    logging.captureWarnings(True)  # the warnings that remain reach train.log too
    if logging.getLogger().handlers:
        # Lightning imported before logging was configured keeps a private stderr handler;
        # hand its records to the root logger (console + train.log) instead.
        for name in ("pytorch_lightning", "lightning_fabric"):
            lg = logging.getLogger(name)
            for h in [h for h in lg.handlers if type(h) is logging.StreamHandler]:
                lg.removeHandler(h)
            lg.propagate = True


def check_precision(spec: RunSpec) -> None:
    """Resolve ``trainer.precision=auto`` in ``spec`` (the reason goes to ``spec.precision_auto``),
    then refuse bf16 on a CPU without it."""
    import torch

    from scalelab.runtime import auto_precision, check_cpu_precision
    from scalelab.training.devices import uses_gpu

    accelerator, has_cuda = str(spec.trainer.accelerator), torch.cuda.is_available()
    if str(spec.trainer.precision) == "auto":
        on_gpu = uses_gpu(accelerator)
        spec.trainer.precision, spec.precision_auto = auto_precision(
            on_gpu, spec.model.d_model, gpu_bf16=on_gpu and has_cuda and torch.cuda.is_bf16_supported())
    check_cpu_precision(str(spec.trainer.precision), accelerator, has_cuda)


def fixed_threads(spec: RunSpec) -> int | None:
    """The thread count set by hand (``train.num_threads``, else ``OMP_NUM_THREADS``), or None."""
    threads = spec.train.num_threads or os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(threads) if str(threads).isdigit() and int(threads) > 0 else None


def run_threads(spec: RunSpec, plan: Callable[..., Any] = thread_plan) -> int:
    """Torch threads of one process of this run: ``train.num_threads``, else ``OMP_NUM_THREADS``
    (torchrun's and Lightning's convention), else the cores // every process sharing them: a
    parallel sweep's points (SCALELAB_CONCURRENT_PROCS) x this run's ranks on the node. With
    several ranks here the choice is exported as ``OMP_NUM_THREADS``, so Lightning's DDP
    launcher keeps it and the ranks it starts take the same."""
    if (fixed := fixed_threads(spec)) is not None:
        return fixed
    ranks_here = max(1, spec.world_size // max(1, int(spec.trainer.num_nodes)))
    chosen = int(plan(concurrent=concurrent_processes() * ranks_here).threads)
    if ranks_here > 1:
        os.environ["OMP_NUM_THREADS"] = str(chosen)
    return chosen


def setup_torch(spec: RunSpec) -> None:
    """Threads (applied here, when the run starts) and matmul precision."""
    import torch

    quiet_lightning()
    torch.set_num_threads(run_threads(spec))
    torch.set_float32_matmul_precision(str(spec.train.matmul_precision))


def seed_everything(spec: RunSpec) -> None:
    """Every seed (Python, numpy, torch, dataloader workers), with Lightning's own function.
    Called once the inputs are checked: importing Lightning costs seconds that a bad input
    should not wait for, and the data preparation before it draws from seeded generators of
    its own."""
    import pytorch_lightning as pl

    pl.seed_everything(spec.seed, workers=True, verbose=False)
