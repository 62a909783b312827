"""Which processes and devices a job has, without loading Lightning (nor torch, unless
``trainer.devices``/``accelerator`` are ``auto`` and CUDA must be asked).

The CLI reads these before the config is validated (torchrun's layout fills
``trainer.devices: auto``; a joblib sweep on GPUs claims one device per job), so a config
error costs no Lightning import.
Strategies themselves live in ``training.distributed``.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

# --- which processes, how many --------------------------------------------------------------


def launched_by_torchrun() -> bool:
    """torch.distributed.is_torchelastic_launched()'s test, without importing torch."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def torchrun_layout() -> tuple[int, int] | None:
    """(processes per node, nodes) when torchrun started this process, else None.

    Lightning's TorchElasticEnvironment insists that trainer.devices x trainer.num_nodes equals
    torchrun's WORLD_SIZE; the CLI fills ``devices: auto`` from this, so
    ``torchrun --nproc_per_node=N -m scalelab.cli.train trainer=ddp`` needs no other flag.
    """
    if not launched_by_torchrun():
        return None
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    return local, max(1, int(os.environ["WORLD_SIZE"]) // local)


def uses_gpu(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` puts the run on CUDA (``auto`` asks torch)."""
    if accelerator in ("gpu", "cuda"):
        return True
    if accelerator != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def resolve_devices(accelerator: str, devices: Any, num_nodes: int = 1) -> tuple[Any, int, int]:
    """(devices, num_nodes, world_size) before the Trainer exists, so the batch can be derived.

    ``devices="auto"``/``-1`` mean every visible device (CPU: one process, like Lightning).
    Under torchrun, ``auto`` takes the layout from torchrun (:func:`torchrun_layout`).
    """
    if num_nodes is None or int(num_nodes) < 1:
        raise ValueError(f"trainer.num_nodes={num_nodes!r}: must be a positive integer")
    num_nodes = int(num_nodes)
    layout = torchrun_layout()
    if layout is not None and str(devices) in ("auto", "-1", "None"):
        return layout[0], layout[1], layout[0] * layout[1]
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif str(devices) in ("auto", "-1", "None"):
        import torch

        count = max(1, torch.cuda.device_count()) if uses_gpu(accelerator) else 1
    elif isinstance(devices, str) and "," in devices:  # "0,1" / "3,": these device indices
        count = len([p for p in devices.split(",") if p.strip()])
    else:
        try:
            count = int(devices)
        except (TypeError, ValueError):
            raise ValueError(f"trainer.devices={devices!r}: use an integer, 'auto', or a list "
                             "of device ids") from None
    if count < 1:
        raise ValueError(f"trainer.devices={devices!r}: need at least one device")
    return devices, num_nodes, count * num_nodes


# --- one local job per device (joblib) ------------------------------------------------------


def claim_device(lock_dir: str | Path, n_devices: int, timeout_s: float = 3600.0) -> tuple[int, Any]:
    """Take the first free device index in ``range(n_devices)`` for this process.

    Parallel jobs on one machine (``hydra/launcher=joblib hydra.launcher.n_jobs=<GPUs>``) each call
    this and get distinct indices; the claim is an OS file lock, released when the process exits
    or the returned handle is closed (so a crashed job frees its device).
    """
    d = Path(lock_dir)
    d.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        for i in range(n_devices):
            fh = open(d / f"device{i}.lock", "a+")  # noqa: SIM115 - held for the job's lifetime
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return i, fh
            except BlockingIOError:
                fh.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"no free device among {n_devices} after {timeout_s:.0f}s "
                               f"(locks in {d}); lower hydra.launcher.n_jobs")
        time.sleep(1.0)
