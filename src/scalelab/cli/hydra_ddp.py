"""Hydra + multi-process training: the command that starts rank k of the *current job*.

Lightning's own launcher re-runs ``sys.argv``. Under ``--multirun`` that is the whole sweep (every
rank would relaunch it: Lightning #11300, lightning-hydra-template #393), and in a joblib/submitit
worker it is the worker's argv. Here the command is rebuilt from the job itself:

    python -m scalelab.cli.train [--config-dir D] --config-name N  <the job's overrides>
        <the user's hydra.* overrides, minus mode/launcher/sweeper/sweep>
        hydra.run.dir=<this job's output dir> hydra.output_subdir=null hydra.job.name=<name>_rank<k>

so each child runs exactly this job, in single-run mode, inside the job's folder, writing no
``.hydra/`` copy. Children see LOCAL_RANK>0 and never create MLflow runs (tracking's guard).

torchrun starts every rank itself, each running the whole CLI. :func:`torchrun_argv` makes ranks
> 0 reuse rank 0's output folder (rank 0 publishes it through torchrun's agent store), so a
torchrun run also has exactly one folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

ENTRY_MODULE = "scalelab.cli.train"

# hydra overrides that describe the sweep, not the job: a child must not inherit them.
_SWEEP_ONLY = ("hydra.mode", "hydra/launcher", "hydra.launcher", "hydra/sweeper", "hydra.sweeper",
               "hydra.sweep", "hydra.run.dir", "hydra.output_subdir", "hydra.job.name")


def _quote(value: str) -> str:
    """A Hydra override value that survives any path characters."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def job_command(local_rank: int, entry_module: str = ENTRY_MODULE) -> tuple[list[str], str]:
    """(argv, cwd) that runs the current Hydra job as local rank ``local_rank``."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    argv = [sys.executable, "-m", entry_module]
    for source in hc.runtime.config_sources:
        if source.provider == "command-line":  # a user --config-dir
            argv.append(f"--config-dir={source.path}")
    argv.append(f"--config-name={hc.job.config_name}")
    argv += list(hc.overrides.task)
    argv += [o for o in hc.overrides.hydra if not _override_key(o).startswith(_SWEEP_ONLY)]
    argv += [
        f"hydra.run.dir={_quote(str(hc.runtime.output_dir))}",
        "hydra.output_subdir=null",  # rank 0 already wrote .hydra/
        f"hydra.job.name={hc.job.name}_rank{local_rank}",  # own log file, same folder
    ]
    return argv, hc.runtime.cwd


# --- torchrun -------------------------------------------------------------------------------


def _store_key() -> str:
    return (f"scalelab/output_dir/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/"
            f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")


def _agent_store(timeout_s: float = 600.0) -> Any:  # a torch.distributed.TCPStore
    import torch.distributed as dist

    # torchrun's agent serves a TCPStore at MASTER_ADDR:MASTER_PORT for its workers.
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=timedelta(seconds=timeout_s))


def _torchrun_rank() -> int | None:
    # torch's is_torchelastic_launched() reads this variable: checking it first keeps Lightning
    # (imported by training.distributed) out of every start that torchrun did not launch
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    from scalelab.training.devices import launched_by_torchrun

    return int(os.environ["RANK"]) if launched_by_torchrun() else None


def torchrun_argv(argv: Sequence[str]) -> list[str]:
    """Call before Hydra parses argv. Ranks > 0 of a torchrun job run in rank 0's folder."""
    argv = list(argv)
    rank = _torchrun_rank()
    if rank is None:
        return argv
    if any(a in ("-m", "--multirun") for a in argv[1:]):
        raise ValueError(
            "torchrun with --multirun would run the sweep once per rank; run one training per "
            "torchrun, or sweep with `-m hydra/launcher=slurm` (each point a multi-GPU job)"
        )
    if rank == 0:
        return argv
    out_dir = _agent_store().get(_store_key()).decode()
    return [*argv, f"hydra.run.dir={_quote(out_dir)}", "hydra.output_subdir=null",
            f"hydra.job.name=train_rank{rank}"]


def publish_output_dir(output_dir: str) -> None:
    """Rank 0 of a torchrun job: tell the other ranks which folder this run uses."""
    if _torchrun_rank() == 0:
        _agent_store().set(_store_key(), str(output_dir))


# --- per job: called by scalelab.cli.train around each Hydra job ------------------------------
_device_claim: Any = None  # the lock file handle of this job's GPU (joblib sweeps)


def begin_job(cfg: Any) -> None:
    """Before the config is validated: adapt ``cfg.trainer`` to how this process was launched.

    - torchrun: ``trainer.devices: auto`` becomes torchrun's processes per node (and num_nodes
      its node count), which Lightning's TorchElasticEnvironment requires; rank 0 publishes
      its run folder for the other ranks (:func:`torchrun_argv`).
    - joblib sweep on GPUs with ``trainer.devices=1``: this job takes a GPU no other job of the
      sweep holds (``claim_device``), so ``hydra.launcher.n_jobs=8`` runs 8 jobs on 8 GPUs.
    """
    global _device_claim
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from scalelab.training.devices import claim_device, torchrun_layout, uses_gpu

    trainer = cfg.trainer
    layout = torchrun_layout()
    if layout is not None:
        if str(trainer.devices) in ("auto", "-1"):
            trainer.devices, trainer.num_nodes = layout
        if HydraConfig.initialized():
            publish_output_dir(str(HydraConfig.get().runtime.output_dir))
        return
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hc = HydraConfig.get()
    if "joblib" not in str(hc.launcher.get("_target_", "")).lower():
        return
    import torch

    if uses_gpu(str(trainer.accelerator)) and str(trainer.devices) == "1" and torch.cuda.device_count() > 1:
        idx, _device_claim = claim_device(Path(hc.sweep.dir) / ".device_locks",
                                          torch.cuda.device_count())
        trainer.devices = [idx]


def end_job() -> None:
    """After a job (also a failed one): join its ranks, drop the process group, restore the launch
    env, free its GPU claim. The next job of a sweep in this process starts clean."""
    global _device_claim
    # Only a job that built a strategy can have ranks to release; one that stopped earlier
    # (a config error) must not pay Lightning's import for nothing.
    distributed = sys.modules.get("scalelab.training.distributed")
    if distributed is not None:
        distributed.release_distributed()
    if _device_claim is not None:
        _device_claim.close()
        _device_claim = None
