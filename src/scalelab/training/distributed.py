"""Many devices on Lightning's own strategies: DDP, FSDP, torchrun, SLURM.

Nothing here schedules jobs. It builds Lightning's strategy from the trainer config, starts a
Hydra job's other local ranks itself, and converts FSDP's sharded checkpoints into plain ones.

Why scalelab starts the ranks: Lightning's popen launcher re-runs ``sys.argv``. Inside
``--multirun`` that argv holds the whole sweep, so every rank would relaunch it (Lightning #11300,
lightning-hydra-template #393); inside a joblib or submitit worker ``sys.argv`` is the worker's.
So rank 0 of a node starts ranks 1..N-1 with a ``child_command(local_rank) -> (argv, cwd)``
callable from the CLI, which rebuilds the command for exactly the current job (the Hydra part
lives in ``scalelab.cli.hydra_ddp`` so this layer stays free of Hydra), and exports
``LOCAL_RANK=0`` and the rest of the launch environment in its own process. That is Lightning's
documented protocol for processes created outside it: its ``LightningEnvironment`` then reports
``creates_processes_externally`` and a plain ``DDPStrategy``/``FSDPStrategy`` starts no process.

That environment must not outlive the job: the next job of a sweep in the same process (basic
launcher, a reused joblib worker) would believe it runs under an external launcher and hang.
:func:`release_distributed` joins the ranks, drops the process group and restores the
environment at the end of a job (and :func:`build_strategy` calls it first, as a safety net).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning_fabric.plugins.environments import (
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, Strategy

# (argv, cwd) of the process that becomes local rank ``local_rank`` of the current job.
ChildCommand = Callable[[int], tuple[Sequence[str], str | None]]

# Env vars start_local_ranks() sets in this process; restored by release_distributed().
_LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
# Schedulers that start every rank themselves; Lightning picks their environment over its own.
_EXTERNAL_LAUNCHERS = (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment)
_saved_env: dict[str, str | None] | None = None
_children: list[subprocess.Popen] = []
_watcher: tuple[threading.Thread, threading.Event] | None = None
log = logging.getLogger("scalelab.train")


def starts_own_ranks(num_processes: int) -> bool:
    """Whether this process must start the node's other ranks: more than one per node, and no
    launcher (torchrun, srun, jsrun, mpirun, or a parent scalelab rank) started them already."""
    if num_processes <= 1 or "LOCAL_RANK" in os.environ:
        return False
    return not any(env.detect() for env in _EXTERNAL_LAUNCHERS)


def start_local_ranks(num_processes: int, num_nodes: int, child_command: ChildCommand) -> None:
    """Start local ranks 1..num_processes-1 of this job and make this process local rank 0.

    The variables and values are those Lightning's own launcher exports (address and port from
    ``LightningEnvironment``: the user's MASTER_ADDR/MASTER_PORT, else localhost and a free port).
    """
    global _saved_env, _watcher
    cluster = LightningEnvironment()
    _saved_env = {k: os.environ.get(k) for k in _LAUNCH_ENV}
    os.environ.update({
        "MASTER_ADDR": cluster.main_address, "MASTER_PORT": str(cluster.main_port),
        "NODE_RANK": str(cluster.node_rank()), "LOCAL_RANK": "0",
        "WORLD_SIZE": str(num_processes * num_nodes),
    })
    for local_rank in range(1, num_processes):
        argv, cwd = child_command(local_rank)
        env = {**os.environ, "LOCAL_RANK": str(local_rank)}
        _children.append(subprocess.Popen(list(argv), env=env, cwd=cwd))
    stop = threading.Event()
    thread = threading.Thread(target=_watch_children, args=(list(_children), stop),
                              name="scalelab-rank-watch", daemon=True)
    thread.start()
    _watcher = (thread, stop)


def _watch_children(children: list[subprocess.Popen], stop: threading.Event,
                    every_s: float = 2.0) -> None:
    """Fail the job as soon as a rank fails: the others would wait for it in their next
    collective until the backend's timeout (30 min and more). Like Lightning's own launcher,
    every rank of the job is killed; the one line logged first names the rank that failed."""
    while not stop.wait(every_s):
        codes = [proc.poll() for proc in children]
        failed = [(rank, code) for rank, code in enumerate(codes, start=1) if code]
        if failed:
            rank, code = failed[0]
            log.error("local rank %d exited with code %d: see its *_rank%d.log in the run folder; "
                      "stopping every rank of this job", rank, code, rank)
            for proc in children:
                proc.kill()
            os.kill(os.getpid(), signal.SIGKILL)
        if all(code == 0 for code in codes):
            return


class ScalelabFSDPStrategy(FSDPStrategy):
    """FSDPStrategy that records each parameter's shape before wrapping.

    Note: Lightning's "FSDP needs a GPU accelerator" check only fires for the exact class
    FSDPStrategy, so :func:`build_strategy` repeats it for this subclass.
    """

    def setup(self, trainer: Any) -> None:
        # FSDP1 with use_orig_params=True (Lightning's default) turns each parameter into a flat
        # 1-D view of this rank's shard, so "is it a matrix?" (which parameters get weight decay,
        # training/optim.py) must be answered before wrapping: remember the original ndim.
        tag_original_ndim(trainer.lightning_module)
        super().setup(trainer)


ORIG_NDIM = "scalelab_orig_ndim"  # attribute on each nn.Parameter, read by training/optim.py


def tag_original_ndim(module: torch.nn.Module) -> None:
    """Record every parameter's ndim before FSDP flattens it (see ScalelabFSDPStrategy.setup)."""
    for p in module.parameters():
        if not hasattr(p, ORIG_NDIM):
            setattr(p, ORIG_NDIM, p.ndim)


def release_distributed(wait_s: float = 120.0) -> None:
    """End of a job, on every rank: where this process started ranks, wait for them and say
    which failed; drop the process group; restore the env :func:`start_local_ranks` changed.

    Safe to call always. Rank 0 drops its group only once its ranks have ended, so none loses a
    peer mid-call.
    """
    global _saved_env, _watcher
    if _watcher is not None:  # from here on a failed rank is reported, not fatal
        thread, stop = _watcher
        stop.set()
        thread.join()
        _watcher = None
    joined = torch.distributed.is_available() and torch.distributed.is_initialized()
    if _saved_env is not None:
        # A rank 0 that never joined the group (an error while building the Trainer) ends its
        # job alone: its ranks would wait for it until the rendezvous times out.
        _wait_for_children(wait_s if joined else 0.0)
    if joined:
        _drop_process_group()
    if _saved_env is None:
        return
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _saved_env = None


def _drop_process_group() -> None:
    """Destroy the group so that gloo's worker threads are joined now, on every rank.

    Why: a gloo thread drops each finished collective a moment after the caller got its result;
    where that frees a tensor Python made, it takes the GIL. Once the interpreter is exiting,
    taking the GIL ends the thread with pthread_exit, which aborts the process ("terminate
    called without an active exception", exit -6) after all its work is done (a core dump showed
    exactly this). The threads stop only when the group's last reference goes, and the finished
    trainer's DDP or FSDP wrapper still holds one in a reference cycle. Collecting that first,
    while the registry still holds the group, lets destroy_process_group drop the last reference
    through torch's binding, which joins the threads with the GIL released (they may need it).
    """
    _drop_failure_locals()
    gc.collect()
    torch.distributed.destroy_process_group()
    if left := gloo_threads():
        log.warning("%d gloo threads outlived the process group (something still holds it): this "
                    "process may abort at exit after its work is done", left)


def _drop_failure_locals() -> None:
    """A failing job's traceback keeps its finished frames, and with them the trainer and its
    group: drop those frames' locals, along the exception's chain (a config error becomes
    SystemExit), while the tracebacks' lines stay for the report."""
    failure, seen = sys.exc_info()[1], set()
    while failure is not None and id(failure) not in seen:
        seen.add(id(failure))
        if failure.__traceback__ is not None:
            traceback.clear_frames(failure.__traceback__)
        failure = failure.__cause__ or failure.__context__


def gloo_threads() -> int:
    """This process's gloo threads (each group runs workers and a socket loop); 0 off Linux."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    count = 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += "gloo" in f.read()
        except OSError:  # the thread ended while we looked
            continue
    return count


def _wait_for_children(wait_s: float) -> None:
    """Join the ranks this process started, killing those still running after ``wait_s``
    (0: at once, the job ended before the ranks met) and naming each that failed."""
    deadline = time.monotonic() + wait_s
    for local_rank, proc in enumerate(_children, start=1):
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()) if wait_s else 0)
        except subprocess.TimeoutExpired:
            if wait_s:
                log.warning("local rank %d still ran %.0f s after this one ended: killed it",
                            local_rank, wait_s)
            else:
                log.warning("local rank %d stopped: this rank ended before the ranks met",
                            local_rank)
            proc.kill()
            proc.wait()
            continue
        if code:
            log.warning("local rank %d exited with code %d: see its *_rank%d.log in the run folder",
                        local_rank, code, local_rank)
    _children.clear()


# --- building the strategy ------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def block_classes() -> set[type[torch.nn.Module]]:
    """The transformer block classes FSDP wraps one by one (and checkpoints activations of)."""
    from scalelab.model.blocks import Block, CrossBlock

    return {Block, CrossBlock}


def fsdp_mixed_precision(spec: dict[str, Any] | None) -> Any:
    """MixedPrecision from ``{param_dtype, reduce_dtype, buffer_dtype}``; None = from precision."""
    if not spec:
        return None
    from torch.distributed.fsdp import MixedPrecision

    kw = {}
    for key in ("param_dtype", "reduce_dtype", "buffer_dtype"):
        name = spec.get(key)
        if name is None:
            continue
        if name not in _DTYPES:
            raise ValueError(f"trainer.fsdp.mixed_precision.{key}={name!r}: choose one of "
                             f"{sorted(_DTYPES)}")
        kw[key] = _DTYPES[name]
    return MixedPrecision(**kw)


def build_strategy(
    strategy: str,
    accelerator: str,
    *,
    fsdp: dict[str, Any] | None = None,
    ddp: dict[str, Any] | None = None,
    child_command: ChildCommand | None = None,
    num_processes: int = 1,
    num_nodes: int = 1,
) -> str | Strategy:
    """The Trainer's ``strategy=`` argument for a config value.

    ``ddp``: gloo on CPU, nccl on GPU (Lightning's choice); ``fsdp``: one FSDP unit per transformer
    block, MixedPrecision from ``fsdp.mixed_precision`` (or the Trainer precision), and
    ``fsdp.state_dict_type`` (``sharded`` = each rank writes its shard, resumable; convert with
    :func:`scalelab.training.checkpoint.consolidate_checkpoint`). Anything else goes to Lightning
    unchanged.

    With ``child_command``, this process starts the node's other ``num_processes - 1`` ranks
    (:func:`start_local_ranks`) once the strategy is built; without it, or under torchrun / SLURM
    (Lightning picks TorchElasticEnvironment / SLURMEnvironment), Lightning's own launcher decides.
    """
    release_distributed()  # a previous job in this process may have left its ranks' state
    ddp = dict(ddp or {})
    if strategy == "ddp":
        built: Strategy = DDPStrategy(**ddp)
        # spawn/fork start their ranks from this process without re-running a command
        popen = ddp.get("start_method", "popen") == "popen"
    elif strategy == "fsdp":
        built, popen = _fsdp_strategy(accelerator, dict(fsdp or {})), True
    else:
        return strategy
    if child_command is not None and popen and starts_own_ranks(num_processes):
        start_local_ranks(num_processes, num_nodes, child_command)
    return built


def _fsdp_strategy(accelerator: str, opts: dict[str, Any]) -> ScalelabFSDPStrategy:
    if accelerator not in ("gpu", "cuda"):
        raise ValueError(
            f"trainer.strategy=fsdp needs trainer.accelerator=gpu (got {accelerator!r}); "
            "Lightning's FSDP runs on CUDA only. Use trainer=ddp on CPU."
        )
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    wrap = opts.pop("auto_wrap", "block")
    if wrap not in ("block", None, "none"):
        raise ValueError(f"trainer.fsdp.auto_wrap={wrap!r}: choose 'block' or null")
    policy = ModuleWrapPolicy(block_classes()) if wrap == "block" else None
    ckpt = block_classes() if opts.pop("activation_checkpointing", False) else None
    return ScalelabFSDPStrategy(
        auto_wrap_policy=policy,
        activation_checkpointing_policy=ModuleWrapPolicy(ckpt) if ckpt else None,
        mixed_precision=fsdp_mixed_precision(opts.pop("mixed_precision", None)),
        sharding_strategy=opts.pop("sharding_strategy", "FULL_SHARD"),
        state_dict_type=opts.pop("state_dict_type", "sharded"),
        cpu_offload=opts.pop("cpu_offload", False),
        **opts,
    )
