"""Process-wide settings before a run is built: CPU precision check, threads, matmul precision,
seeds, and a Lightning that reports only what matters into train.log."""

from __future__ import annotations

import logging

from scalelab.config.spec import RunSpec


class _DropNoise(logging.Filter):
    """Lightning start-up chatter that says nothing about this run."""

    NOISE = ("litlogger", "GPU available", "TPU available", "`weights_only` was not set",
             "HPU available", "LOCAL_RANK:")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(n in msg for n in self.NOISE)


def quiet_lightning() -> None:
    import warnings

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
    import torch

    from scalelab.runtime import check_cpu_precision

    check_cpu_precision(str(spec.trainer.precision), str(spec.trainer.accelerator),
                        torch.cuda.is_available())


def setup_torch(spec: RunSpec) -> None:
    """Threads, matmul precision and every seed (Python, numpy, torch, dataloader workers)."""
    import pytorch_lightning as pl
    import torch

    from scalelab.runtime import thread_plan

    quiet_lightning()
    # null: cores // processes sharing them (SCALELAB_CONCURRENT_PROCS), fewer on a busy machine
    torch.set_num_threads(int(spec.train.num_threads or thread_plan().threads))
    torch.set_float32_matmul_precision(str(spec.train.matmul_precision))
    pl.seed_everything(spec.seed, workers=True, verbose=False)
