"""Many devices on Lightning's own strategies: DDP, FSDP, torchrun, SLURM.

Nothing here launches or schedules jobs itself. It only fixes what Lightning's popen launcher does
when the entry point is a Hydra app, builds the strategy from the trainer config, and converts
FSDP's sharded checkpoints into plain ones.

Why a custom launcher: Lightning starts ranks 1..N-1 by re-running ``sys.argv`` (see
``lightning_fabric/strategies/launchers/subprocess_script.py``). Inside ``--multirun`` that argv
holds ``--multirun`` and the whole sweep, so every rank relaunches the sweep (Lightning #11300,
lightning-hydra-template #393); inside a joblib or submitit worker ``sys.argv``/``__main__`` is the
worker's, not ours. Our launcher takes a ``child_command(local_rank) -> (argv, cwd)`` callable
from the CLI, which rebuilds the command for exactly the current job (the Hydra part lives in
``scalelab.cli.hydra_ddp`` so this layer stays free of Hydra).

Lightning also leaves ``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_PORT`` in ``os.environ`` and the
process group alive after ``fit``; the next job of a sweep in the same process (basic launcher,
a reused joblib worker) would then believe it runs under an external launcher and hang.
:func:`release_distributed` undoes that at the end of a job (and :func:`build_strategy` calls it
before building a new strategy, as a safety net).
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning_fabric.plugins import ClusterEnvironment
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy, Strategy
from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

# (argv, cwd) of the process that becomes local rank ``local_rank`` of the current job.
ChildCommand = Callable[[int], tuple[Sequence[str], str | None]]

# Env vars Lightning's launcher writes into the parent; restored by release_distributed().
_LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
_saved_env: dict[str, str | None] | None = None
_children: list[subprocess.Popen] = []
log = logging.getLogger("scalelab.train")


class HydraAwareLauncher(_SubprocessScriptLauncher):
    """Lightning's popen launcher, with the child command supplied by the caller."""

    def __init__(self, cluster_environment: ClusterEnvironment, num_processes: int,
                 num_nodes: int, child_command: ChildCommand) -> None:
        super().__init__(cluster_environment, num_processes, num_nodes)
        self.child_command = child_command

    def _call_children_scripts(self) -> None:
        global _saved_env
        self._check_can_spawn_children()
        self.procs = []
        if _saved_env is None:
            _saved_env = {k: os.environ.get(k) for k in _LAUNCH_ENV}
        env = self.cluster_environment
        # Same variables and values as Lightning's own launcher.
        os.environ["MASTER_ADDR"] = env.main_address
        os.environ["MASTER_PORT"] = str(env.main_port)
        os.environ["NODE_RANK"] = str(env.node_rank())
        os.environ["LOCAL_RANK"] = str(env.local_rank())
        os.environ["WORLD_SIZE"] = str(self.num_processes * self.num_nodes)
        for local_rank in range(1, self.num_processes):
            child_env = os.environ.copy()
            child_env["LOCAL_RANK"] = str(local_rank)
            if os.environ.get("PL_GLOBAL_SEED") is None:
                child_env.pop("PL_GLOBAL_SEED", None)
            argv, cwd = self.child_command(local_rank)
            proc = subprocess.Popen(list(argv), env=child_env, cwd=cwd)
            self.procs.append(proc)
            _children.append(proc)


class ScalelabDDPStrategy(DDPStrategy):
    """DDPStrategy whose popen launcher starts ranks through ``child_command``."""

    def __init__(self, *args: Any, child_command: ChildCommand | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.child_command = child_command

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self.child_command is not None and self._start_method == "popen":
            assert self.cluster_environment is not None
            self._launcher = HydraAwareLauncher(self.cluster_environment, self.num_processes,
                                                self.num_nodes, self.child_command)


class ScalelabFSDPStrategy(FSDPStrategy):
    """FSDPStrategy whose popen launcher starts ranks through ``child_command``.

    Note: Lightning's "FSDP needs a GPU accelerator" check only fires for the exact class
    FSDPStrategy, so :func:`build_strategy` repeats it for this subclass.
    """

    def __init__(self, *args: Any, child_command: ChildCommand | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.child_command = child_command

    def setup(self, trainer: Any) -> None:
        # FSDP1 with use_orig_params=True (Lightning's default) turns each parameter into a flat
        # 1-D view of this rank's shard, so "is it a matrix?" (which parameters get weight decay,
        # training/optim.py) must be answered before wrapping: remember the original ndim.
        tag_original_ndim(trainer.lightning_module)
        super().setup(trainer)

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self.child_command is not None and self._launcher is not None:
            assert self.cluster_environment is not None
            self._launcher = HydraAwareLauncher(self.cluster_environment, self.num_processes,
                                                self.num_nodes, self.child_command)


ORIG_NDIM = "scalelab_orig_ndim"  # attribute on each nn.Parameter, read by training/optim.py


def tag_original_ndim(module: torch.nn.Module) -> None:
    """Record every parameter's ndim before FSDP flattens it (see ScalelabFSDPStrategy.setup)."""
    for p in module.parameters():
        if not hasattr(p, ORIG_NDIM):
            setattr(p, ORIG_NDIM, p.ndim)


def release_distributed(wait_s: float = 120.0) -> None:
    """End of a job, on every rank: where this process launched ranks, wait for them and say
    which failed; drop the process group; restore the env the launcher changed.

    Safe to call always. The launcher drops its group only once its ranks have ended, so none
    loses a peer mid-call.
    """
    global _saved_env
    if _saved_env is not None:
        _wait_for_children(wait_s)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
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
    deadline = time.monotonic() + wait_s
    for local_rank, proc in enumerate(_children, start=1):
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("local rank %d still ran %.0f s after this one ended: killed it",
                        local_rank, wait_s)
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
) -> str | Strategy:
    """The Trainer's ``strategy=`` argument for a config value.

    ``ddp``: gloo on CPU, nccl on GPU (Lightning's choice); ``fsdp``: one FSDP unit per transformer
    block, MixedPrecision from ``fsdp.mixed_precision`` (or the Trainer precision), and
    ``fsdp.state_dict_type`` (``sharded`` = each rank writes its shard, resumable; convert with
    :func:`scalelab.training.checkpoint.consolidate_checkpoint`). Anything else goes to Lightning unchanged. Under torchrun
    or SLURM Lightning picks TorchElasticEnvironment / SLURMEnvironment and starts no processes.
    """
    release_distributed()  # a previous job in this process may have left its ranks' state
    ddp = dict(ddp or {})
    if strategy == "ddp":
        return ScalelabDDPStrategy(child_command=child_command, **ddp)
    if strategy == "fsdp":
        if accelerator not in ("gpu", "cuda"):
            raise ValueError(
                f"trainer.strategy=fsdp needs trainer.accelerator=gpu (got {accelerator!r}); "
                "Lightning's FSDP runs on CUDA only. Use trainer=ddp on CPU."
            )
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        opts = dict(fsdp or {})
        wrap = opts.pop("auto_wrap", "block")
        if wrap not in ("block", None, "none"):
            raise ValueError(f"trainer.fsdp.auto_wrap={wrap!r}: choose 'block' or null")
        policy = ModuleWrapPolicy(block_classes()) if wrap == "block" else None
        ckpt = block_classes() if opts.pop("activation_checkpointing", False) else None
        return ScalelabFSDPStrategy(
            child_command=child_command,
            auto_wrap_policy=policy,
            activation_checkpointing_policy=ModuleWrapPolicy(ckpt) if ckpt else None,
            mixed_precision=fsdp_mixed_precision(opts.pop("mixed_precision", None)),
            sharding_strategy=opts.pop("sharding_strategy", "FULL_SHARD"),
            state_dict_type=opts.pop("state_dict_type", "sharded"),
            cpu_offload=opts.pop("cpu_offload", False),
            **opts,
        )
    return strategy
