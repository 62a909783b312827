"""CPU choices a run makes from the machine: torch's thread count and bf16 on CPU.

Nothing here acts on import. The train entry point applies the thread count when a run starts
(``cli/torch_setup.py``), so importing scalelab leaves the process as it was.

Threads: the cores this process may use, split evenly between the scalelab processes sharing
them (a parallel sweep sets ``SCALELAB_CONCURRENT_PROCS`` to its job count), so that parallel
runs do not oversubscribe the cores (every OpenMP region would wait for a descheduled thread).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CONCURRENT_ENV = "SCALELAB_CONCURRENT_PROCS"  # scalelab processes sharing this machine's cores


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, so pinned containers count right)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def concurrent_processes() -> int:
    """How many scalelab processes share the cores (``SCALELAB_CONCURRENT_PROCS``, default 1)."""
    raw = os.environ.get(CONCURRENT_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        return 1


@dataclass(frozen=True)
class ThreadPlan:
    threads: int  # torch intra-op threads per process
    cores: int
    concurrent: int

    def describe(self) -> str:
        return (f"{self.threads} threads/process x {self.concurrent} process(es) on "
                f"{self.cores} cores")


def thread_plan(concurrent: int | None = None, cores: int | None = None) -> ThreadPlan:
    """Threads per process for ``concurrent`` processes on ``cores``: cores // processes, >= 1."""
    k = concurrent_processes() if concurrent is None else max(1, int(concurrent))
    n = available_cores() if cores is None else max(1, int(cores))
    return ThreadPlan(max(1, n // k), n, k)


def jobs_and_threads(n_jobs: int, cores: int | None = None) -> tuple[int, int]:
    """A sweep's (parallel jobs, threads per job): jobs capped at the cores, cores // jobs each."""
    n = available_cores() if cores is None else max(1, int(cores))
    jobs = max(1, min(int(n_jobs) if n_jobs >= 1 else n, n))
    return jobs, thread_plan(concurrent=jobs, cores=n).threads


# --- bf16 on CPU ----------------------------------------------------------------------------
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The ``flags`` of /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16_flag(cpuinfo: str | None = None) -> str | None:
    """The flag that makes this CPU's bf16 native (``amx_bf16`` before ``avx512_bf16``), or None."""
    flags = cpu_flags(cpuinfo)
    if flags:
        return next((f for f in reversed(_BF16_FLAGS) if f in flags), None)
    try:  # no /proc/cpuinfo: ask torch (AMX shows up in its capability string)
        import torch

        return "amx_bf16" if "AMX" in str(torch.backends.cpu.get_cpu_capability()).upper() else None
    except Exception:
        return None


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX-BF16 in its flags)."""
    return native_bf16_flag(cpuinfo) is not None


# trainer.precision=auto takes bf16 autocast on a CPU with native bf16 from this width up; on
# narrower models the casts outweigh the faster matmuls (docs/performance.md, bf16 on a CPU).
AUTO_BF16_MIN_D_MODEL = 128


def auto_precision(on_gpu: bool, d_model: int, gpu_bf16: bool = False,
                   cpuinfo: str | None = None) -> tuple[str, str]:
    """What ``trainer.precision=auto`` runs, and why (one phrase for the start banner)."""
    if on_gpu:
        return ("bf16-mixed", "the GPU has bf16") if gpu_bf16 else ("32-true", "the GPU has no bf16")
    flag = native_bf16_flag(cpuinfo)
    if flag is None:
        return "32-true", "this CPU has no native bf16"
    if d_model < AUTO_BF16_MIN_D_MODEL:
        return "32-true", f"d_model {d_model} < {AUTO_BF16_MIN_D_MODEL}, where bf16 ran slower"
    return "bf16-mixed", f"native bf16 CPU ({flag}), d_model {d_model} >= {AUTO_BF16_MIN_D_MODEL}"


def check_cpu_precision(precision: str, accelerator: str, has_cuda: bool,
                        native_bf16: bool | None = None) -> None:
    """Refuse bf16 on a CPU without bf16 units: it would run ~16x slower than fp32, silently."""
    p = str(precision).lower()
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not has_cuda)
    if not (on_cpu and p.startswith("bf16")):
        return
    if native_bf16 is None:
        native_bf16 = cpu_has_native_bf16()
    if not native_bf16:
        raise ValueError(
            f"trainer.precision={precision}: this CPU has no native bf16 (no avx512_bf16/amx_bf16 "
            "flag), where bf16 runs ~16x slower than fp32; use trainer.precision=32-true")
