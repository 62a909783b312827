"""CPU run-time settings chosen from the machine: torch threads, OpenMP wait policy, bf16 support,
and glibc's heap (:func:`keep_freed_memory`).

Imports nothing heavy (no torch): ``scalelab.cli`` applies :func:`apply_omp_env` before torch
loads libgomp, which reads ``OMP_WAIT_POLICY`` once, at load time.

The rule (measured on a 2-core EPYC, shakespeare_char shape, plain loop; docs/performance.md):

- threads = cores this process may use (``os.sched_getaffinity``) // processes sharing them
  (``SCALELAB_CONCURRENT_PROCS``, which the sweep sets to its joblib ``n_jobs``), at least 1;
- the wait policy is left to libgomp (it spins briefly, then sleeps), which was as fast as
  ``ACTIVE`` on an idle machine (38.9 vs 38.8 ms/step with 2 threads) while ``PASSIVE`` made
  2 threads as slow as 1 (64.4 ms/step);
- when the machine is already busy (other processes' CPU use, measured over 0.1 s, leaves
  fewer free cores than we would use) threads drop to the free cores (>= 1) and, where that
  still leaves a team of threads, the policy becomes ``PASSIVE``: threads that spin while their
  partner is descheduled made a step 2.8x slower (195 vs 68-73 ms) with one competing busy
  process;
- during a run the count follows the load (:func:`threads_under_load`,
  ``training/threads.py``).

"Busy" is measured now, not read from the 1-minute load average: that average still showed
0.6-1.3 a minute after our own previous run had ended, so a second run started on an idle
2-core machine got 1 thread and ``PASSIVE`` (the bench's platform side, every sequential sweep
point). A sweep's sibling processes are part of the plan (``SCALELAB_CONCURRENT_PROCS``), so
their CPU use is not counted again as other work.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CONCURRENT_ENV = "SCALELAB_CONCURRENT_PROCS"  # processes sharing this machine's cores (sweeps)
_AUTO_MARK = "SCALELAB_OMP_AUTO"  # set when OMP_WAIT_POLICY came from us, not from the user


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity; cgroup-pinned containers count right)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS/Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def concurrent_processes() -> int:
    """How many scalelab processes share the cores (``SCALELAB_CONCURRENT_PROCS``, default 1)."""
    raw = os.environ.get(CONCURRENT_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        return 1


LOAD_WINDOW_S = 0.1  # long enough for a busy core to show as ~10 clock ticks, short at start-up


def _busy_ticks(stat: str, cpus: set[int]) -> int:
    """Non-idle clock ticks of ``cpus`` in a /proc/stat text (user..steal; idle and iowait not)."""
    busy = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy


def busy_cores_of_others(before: str, after: str, cpus: set[int], own_cpu_s: float,
                         elapsed_s: float, tick_hz: float) -> float:
    """Cores other processes kept busy between two /proc/stat snapshots (ours subtracted)."""
    busy_s = (_busy_ticks(after, cpus) - _busy_ticks(before, cpus)) / tick_hz
    return max(0.0, (busy_s - own_cpu_s) / max(elapsed_s, 1e-6))


def _children_cpu_s(tick_hz: float) -> float:
    """CPU seconds of this process's live children (DataLoader workers): ours, not other work."""
    total = 0.0
    for kids in Path("/proc/self/task").glob("*/children"):
        for pid in kids.read_text().split():
            try:  # fields after the ")" of the name: utime and stime are the 12th and 13th
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick_hz
            except (OSError, IndexError, ValueError):  # it ended between the two reads
                continue
    return total


def own_cpu_s() -> float:
    """CPU seconds of every thread of this process and of its live children."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime + _children_cpu_s(os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class CpuSample:
    """One reading of the machine's CPU counters and our own, to difference with a later one."""
    stat: str  # /proc/stat
    own_cpu_s: float
    at: float  # time.monotonic()


def cpu_sample() -> CpuSample:
    """Raises OSError where there is no /proc/stat (macOS)."""
    return CpuSample(Path("/proc/stat").read_text(), own_cpu_s(), time.monotonic())


def other_load_between(before: CpuSample, after: CpuSample) -> float:
    """Cores other processes kept busy between two samples, on the CPUs we may run on."""
    return busy_cores_of_others(before.stat, after.stat, set(os.sched_getaffinity(0)),
                                after.own_cpu_s - before.own_cpu_s, after.at - before.at,
                                os.sysconf("SC_CLK_TCK"))


@functools.cache
def measured_other_load(window_s: float = LOAD_WINDOW_S) -> float:
    """Cores other processes use right now, sampled once per process over ``window_s``.

    From /proc/stat on the CPUs this process may run on, minus this process's own CPU time;
    where there is no /proc/stat (macOS), the 1-minute load average.
    """
    try:
        before = cpu_sample()
        time.sleep(window_s)
        return other_load_between(before, cpu_sample())
    except (AttributeError, OSError, ValueError):
        try:
            return max(0.0, os.getloadavg()[0])
        except (AttributeError, OSError):
            return 0.0


def other_load(cores: int) -> float:
    """Cores other processes keep busy now (:func:`measured_other_load`), capped at ``cores``."""
    return min(float(cores), measured_other_load())


@dataclass(frozen=True)
class ThreadPlan:
    threads: int  # torch intra-op threads per process
    wait_policy: str | None  # OMP_WAIT_POLICY to set; None = libgomp's default (brief spin)
    cores: int
    concurrent: int
    load: float

    def describe(self) -> str:
        policy = self.wait_policy or "default"
        return (f"{self.threads} threads/process x {self.concurrent} process(es) on "
                f"{self.cores} cores (load {self.load:.1f}), OMP_WAIT_POLICY={policy}")


def thread_plan(concurrent: int | None = None, cores: int | None = None,
                load: float | None = None) -> ThreadPlan:
    """Threads per process and OpenMP wait policy for ``concurrent`` processes on ``cores``.

    ``load`` is the busy cores of every other process, siblings included (default: measured
    now, :func:`other_load`); pass 0 to plan for an idle machine (the sweep planner does, for
    its own k jobs).
    """
    k = concurrent_processes() if concurrent is None else max(1, int(concurrent))
    n = available_cores() if cores is None else max(1, int(cores))
    busy = other_load(n) if load is None else max(0.0, float(load))
    threads = max(1, n // k)
    # our k - 1 siblings (a parallel sweep's other points) are already in the plan
    free = n - max(0.0, busy - (k - 1) * threads)
    if threads * k > free + 0.5:  # oversubscribed: never spin, use only what is free
        threads = max(1, min(threads, math.floor(max(free, 0.0) / k)))
        # One thread has no team to wait on, so PASSIVE would change nothing now; libgomp's
        # default lets the run spin at full speed if it takes threads back mid-run once the
        # other work leaves (training/threads.py: the policy cannot change after start).
        return ThreadPlan(threads, "PASSIVE" if threads > 1 else None, n, k, busy)
    return ThreadPlan(threads, None, n, k, busy)


RAISE_MARGIN = 0.25  # busy cores: a neighbour near the line must not flip the count every look


def thread_ceiling(start_threads: int, cores: int | None = None, concurrent: int | None = None) -> int:
    """The most threads a run that started with ``start_threads`` may take during the run: what
    an idle machine would have given it, unless its threads wait PASSIVE (read once, at start),
    where more threads would only be as fast as the start's (2 PASSIVE threads ran as slow as 1)."""
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        return int(start_threads)
    return max(int(start_threads), thread_plan(concurrent, cores, load=0.0).threads)


def threads_under_load(ceiling: int, others: float, current: int | None = None,
                       cores: int | None = None, concurrent: int | None = None) -> int:
    """Threads for the rest of a run that may use up to ``ceiling`` (:func:`thread_ceiling`) and
    runs ``current`` now, while other processes keep ``others`` cores busy: :func:`thread_plan`'s
    rule, and back up only with :data:`RAISE_MARGIN` to spare. Only the thread count can change
    in a running process; the wait policy stays as libgomp read it at start."""
    def rule(load: float) -> int:
        return max(1, min(int(ceiling), thread_plan(concurrent, cores, load=load).threads))

    want = rule(others)
    if current is not None and want > current:
        want = max(int(current), rule(others + RAISE_MARGIN))
    return want


def jobs_and_threads(n_jobs: int, cores: int | None = None) -> tuple[int, int]:
    """A sweep's (parallel jobs, threads per job): jobs capped at the cores, cores // jobs each."""
    n = available_cores() if cores is None else max(1, int(cores))
    jobs = max(1, min(int(n_jobs) if n_jobs >= 1 else n, n))
    return jobs, thread_plan(concurrent=jobs, cores=n, load=0.0).threads


def apply_omp_env() -> ThreadPlan:
    """Set OMP_WAIT_POLICY for this process (before torch loads), unless the user set it.

    A value we set ourselves (marked) is recomputed, so a sweep's children, which inherit
    the parent's environment and a different ``SCALELAB_CONCURRENT_PROCS``, get their own.
    """
    plan = thread_plan()
    user_set = "OMP_WAIT_POLICY" in os.environ and _AUTO_MARK not in os.environ
    if not user_set:
        if plan.wait_policy:
            os.environ["OMP_WAIT_POLICY"] = plan.wait_policy
        else:
            os.environ.pop("OMP_WAIT_POLICY", None)
        os.environ[_AUTO_MARK] = "1"
    return plan


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


# trainer.precision=auto takes bf16 autocast on a CPU with native bf16 from this width up, where
# bf16's step was >= 1.3x fp32's on both kinds measured (docs/performance.md, bf16 on CPU).
# bf16 against fp32, plain-loop step, shakespeare_char shape by d_model (heads of 32):
#   2-core AMX Xeon (twenty-ninth session): 128: 1.30-1.58x, 192: 1.64x, 96: 1.26x, 64: 1.14x;
#   2-core AMD EPYC Zen 5, AVX512-BF16 without AMX (thirty-fifth): 128: 1.72x, 192: 2.05x,
#   96: 1.50x, 64: 1.23x, 32: 0.91x.
# Below it casts outweigh the faster GEMMs: a sweep point's d_model 12 ran 0.72x and 0.64x.
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


# --- garbage collection at start-up and exit --------------------------------------------------
# Importing torch, Lightning and MLflow creates millions of long-lived objects; the cyclic
# collector scanned them again and again: 2.4-2.9 s of a 10.5-11.6 s import on a 2-core EPYC
# (`import torch, pytorch_lightning, mlflow`, gc on vs off). At exit the interpreter's final
# collection walked them once more: 3.6-4.2 s between the last log line and the process's end,
# 0.4 s with the heap frozen first. Entry points that exit when done (scalelab-train) pause
# the collector for start-up, freeze what start-up built, and freeze again before exiting.
_gc_paused = False


def pause_gc_for_startup() -> None:
    """Turn the cyclic collector off until :func:`resume_gc_after_startup` (processes that exit
    when their job ends only: what start-up leaves in cycles is kept, not collected)."""
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc_after_startup() -> None:
    """Move everything start-up built out of the collector's reach, then collect as usual."""
    global _gc_paused
    if _gc_paused:
        gc.freeze()
        gc.enable()
        _gc_paused = False


def release_frozen_heap() -> None:
    """After a job: what it built (frozen at its fit) may be collected again, so a --multirun
    that runs its points one after another in this process does not keep every point's cycles."""
    gc.unfreeze()


def freeze_heap_before_exit() -> None:
    """Spare the interpreter's final collection of the whole heap (files are flushed and
    atexit handlers run as usual; only cyclic garbage is left to the OS)."""
    gc.freeze()


# --- glibc's heap ------------------------------------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the most glibc accepts on 64-bit: blocks up to this come from the heap
TRIM_THRESHOLD = 128 << 20  # free memory the heap keeps at its top instead of returning it
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Let glibc's malloc reuse freed activation buffers instead of faulting them in every step.

    Each training step frees and allocates the same buffers again. glibc serves blocks above its
    mmap threshold (128 KiB at start, raised only as larger blocks are freed) with fresh mappings,
    and returns the heap's free top to the kernel, so a fresh process page-faults its activations
    back in step after step: the bert_mlm_small encoder's step took 2,000-3,200 minor faults and
    2.7-5.3 ms of system time (of ~72 ms CPU) on a 2-core Intel Xeon, 28 faults and 0.1-0.35 ms
    with these settings, and ran ~5 % faster (docs/performance.md, twenty-eighth session). Linux
    with glibc only; a user's own malloc settings (MALLOC_* or glibc.malloc tunables) are left
    alone. Returns whether it applied."""
    if (not sys.platform.startswith("linux") or any(k in os.environ for k in _MALLOC_ENV)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (musl names it differently)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
