"""Thread rule, OpenMP policy and CPU bf16 detection (scalelab.runtime)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalelab import runtime as R


def test_idle_machine_uses_every_core_and_lets_openmp_spin() -> None:
    plan = R.thread_plan(concurrent=1, cores=8, load=0.0)
    assert (plan.threads, plan.wait_policy) == (8, None)


def test_concurrent_processes_split_the_cores() -> None:
    assert R.thread_plan(concurrent=2, cores=8, load=0.0).threads == 4
    assert R.thread_plan(concurrent=3, cores=8, load=0.0).threads == 2
    assert R.thread_plan(concurrent=16, cores=8, load=0.0).threads == 1  # never below 1


def test_busy_machine_gets_fewer_threads_and_passive_waits() -> None:
    """PASSIVE where the plan still has a team of threads; one thread has none to wait on, and
    keeps libgomp's default so that threads it takes back mid-run spin at full speed."""
    plan = R.thread_plan(concurrent=1, cores=8, load=4.0)
    assert (plan.threads, plan.wait_policy) == (4, "PASSIVE")
    plan = R.thread_plan(concurrent=1, cores=2, load=1.0)  # one other busy process
    assert (plan.threads, plan.wait_policy) == (1, None)
    plan = R.thread_plan(concurrent=1, cores=2, load=9.0)  # far oversubscribed
    assert (plan.threads, plan.wait_policy) == (1, None)


def test_oversubscribed_by_our_own_jobs_is_passive() -> None:
    assert R.thread_plan(concurrent=2, cores=8, load=7.0).wait_policy == "PASSIVE"  # 2 threads each
    assert R.thread_plan(concurrent=4, cores=2, load=0.0).wait_policy is None  # a thread each


def test_sweep_siblings_are_not_counted_twice() -> None:
    # 2 points on 16 cores, the other point busy on its 8: nothing else runs, so 8 each, spinning
    assert (R.thread_plan(concurrent=2, cores=16, load=8.0).threads,
            R.thread_plan(concurrent=2, cores=16, load=8.0).wait_policy) == (8, None)
    # 4 more busy cores beyond the sibling: 12 free for 2 points
    plan = R.thread_plan(concurrent=2, cores=16, load=12.0)
    assert (plan.threads, plan.wait_policy) == (6, "PASSIVE")


STAT_BEFORE = ("cpu  300 0 30 600 10 0 0 0 0 0\n"
               "cpu0 100 0 10 200 5 0 0 0 0 0\ncpu1 100 0 10 200 5 0 0 0 0 0\n"
               "cpu2 100 0 10 200 0 0 0 0 0 0\nintr 1 2 3\n")
# 1 s at 100 ticks/s: cpu0 busy 80 ticks (20 idle), cpu1 busy 30 (+10 iowait), cpu2 busy 100
STAT_AFTER = ("cpu  510 0 30 690 20 0 0 0 0 0\n"
              "cpu0 170 0 20 220 5 0 0 0 0 0\ncpu1 120 0 20 260 15 0 0 0 0 0\n"
              "cpu2 200 0 10 200 0 0 0 0 0 0\nintr 1 2 3\n")


def test_busy_cores_come_from_the_cpus_we_may_use_minus_our_own_time() -> None:
    busy = R.busy_cores_of_others(STAT_BEFORE, STAT_AFTER, {0, 1}, own_cpu_s=0.0,
                                  elapsed_s=1.0, tick_hz=100)
    assert busy == pytest.approx(1.1)  # cpu2 is outside the affinity; iowait is not busy
    busy = R.busy_cores_of_others(STAT_BEFORE, STAT_AFTER, {0, 1}, own_cpu_s=0.5,
                                  elapsed_s=1.0, tick_hz=100)
    assert busy == pytest.approx(0.6)
    assert R.busy_cores_of_others(STAT_BEFORE, STAT_AFTER, {0}, own_cpu_s=2.0, elapsed_s=1.0,
                                  tick_hz=100) == 0.0  # never negative


def test_a_busy_process_shows_in_the_measured_load(strangers_spinning) -> None:
    """The 1-minute load average still reads ~1 a minute after a busy process ends; the
    measured load must see it while it runs (this test's own CPU time is not counted)."""
    with strangers_spinning(1):
        seen = R.measured_other_load.__wrapped__(0.5)
    assert seen >= 0.6, seen  # a whole core, give or take a loaded machine's sharing


def test_our_own_children_count_as_our_cpu_time_not_as_other_load() -> None:
    """A DataLoader worker is part of the run: its CPU time is the run's own, so it never makes
    the run think the machine is busy."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = R.cpu_sample()
        time.sleep(1.0)
        after = R.cpu_sample()
    finally:
        spin.kill()
        spin.wait(timeout=30)
    assert after.own_cpu_s - before.own_cpu_s >= 0.4  # the child's share of a loaded machine
    assert R.own_cpu_s() < after.own_cpu_s + 0.5  # a child that ended no longer counts live


def test_threads_follow_the_load_by_the_start_rule_up_to_the_ceiling() -> None:
    """2 cores, a run that may use 2 threads: a neighbour using a core takes one away (it reads
    as 0.7 busy while our 2 threads compete with it, 1.0 once we use 1), light background work
    does not; the neighbour leaving gives it back, with a margin so that work near the line
    (0.5 busy) keeps the count where it is."""
    def under(others: float, ceiling: int = 2, cores: int = 2, k: int = 1, now: int | None = None) -> int:
        return R.threads_under_load(ceiling, others, current=now, cores=cores, concurrent=k)

    assert [under(x) for x in (0.0, 0.3, 0.7, 1.0, 2.0)] == [2, 2, 1, 1, 1]
    assert [under(x, now=2) for x in (0.0, 0.5, 0.7)] == [2, 2, 1]
    # back up once the neighbour has gone, but a neighbour near the line does not flip it
    assert [under(x, now=1) for x in (0.0, 0.2, 0.4, 0.5, 1.0)] == [2, 2, 1, 1, 1]
    assert under(0.0, ceiling=1) == 1  # never above the ceiling (a PASSIVE start's own count)
    assert under(0.0, ceiling=8, cores=4) == 4  # nor above the cores
    # a 2-job sweep on 8 cores, 4 threads each: the sibling's 4 busy cores are in the plan
    assert under(4.0, ceiling=4, cores=8, k=2) == 4
    assert under(6.0, ceiling=4, cores=8, k=2) == 3  # 2 cores taken: 6 free for the two


def test_concurrency_comes_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(R.CONCURRENT_ENV, "4")
    assert R.concurrent_processes() == 4
    assert R.thread_plan(cores=8, load=0.0).threads == 2
    monkeypatch.setenv(R.CONCURRENT_ENV, "junk")
    assert R.concurrent_processes() == 1


def test_sweep_jobs_and_threads_follow_the_same_rule() -> None:
    assert R.jobs_and_threads(2, cores=2) == (2, 1)
    assert R.jobs_and_threads(2, cores=16) == (2, 8)
    assert R.jobs_and_threads(8, cores=2) == (2, 1)  # capped at the cores
    assert R.jobs_and_threads(-1, cores=4) == (4, 1)  # joblib's -1: one job per core


def test_available_cores_is_the_affinity() -> None:
    assert R.available_cores() == len(os.sched_getaffinity(0))


def _child_policy(env: dict[str, str]) -> str:
    code = "import os, scalelab.cli; print(os.environ.get('OMP_WAIT_POLICY', 'unset'))"
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "SCALELAB_OMP_AUTO")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True,
                         text=True, check=True, timeout=120)
    return out.stdout.strip()


def test_cli_import_keeps_a_user_policy_and_recomputes_its_own() -> None:
    assert _child_policy({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"  # the user's choice wins
    # 64 processes on this machine's cores: one thread each whatever the load, so libgomp's
    # default, even though the parent had set (and marked) another value
    assert _child_policy({"OMP_WAIT_POLICY": "ACTIVE", "SCALELAB_OMP_AUTO": "1",
                          R.CONCURRENT_ENV: "64"}) == "unset"


CPUINFO_ZEN4 = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
CPUINFO_ZEN3 = "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n"
CPUINFO_SPR = "processor\t: 0\nflags\t\t: avx512f amx_bf16 amx_tile amx_int8\n"


def test_bf16_detection_from_cpu_flags() -> None:
    assert R.cpu_has_native_bf16(CPUINFO_ZEN4)
    assert R.cpu_has_native_bf16(CPUINFO_SPR)
    assert not R.cpu_has_native_bf16(CPUINFO_ZEN3)


def test_bf16_on_a_cpu_without_it_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError) as e:
        R.check_cpu_precision("bf16-mixed", "cpu", has_cuda=False, native_bf16=False)
    msg = str(e.value)
    assert "trainer.precision=bf16-mixed" in msg and "32-true" in msg and "\n" not in msg
    with pytest.raises(ValueError):  # auto on a machine without CUDA is the CPU too
        R.check_cpu_precision("bf16-true", "auto", has_cuda=False, native_bf16=False)


def test_bf16_allowed_where_native_or_not_on_cpu() -> None:
    R.check_cpu_precision("bf16-mixed", "cpu", has_cuda=False, native_bf16=True)
    R.check_cpu_precision("bf16-mixed", "gpu", has_cuda=True, native_bf16=False)
    R.check_cpu_precision("bf16-mixed", "auto", has_cuda=True, native_bf16=False)
    R.check_cpu_precision("32-true", "cpu", has_cuda=False, native_bf16=False)


def test_auto_precision_takes_bf16_on_a_native_bf16_cpu_for_a_wide_enough_model() -> None:
    wide = R.AUTO_BF16_MIN_D_MODEL
    assert R.auto_precision(False, wide, cpuinfo=CPUINFO_SPR) == (
        "bf16-mixed", f"native bf16 CPU (amx_bf16), d_model {wide} >= {wide}")
    assert R.auto_precision(False, wide, cpuinfo=CPUINFO_ZEN4) == (  # AVX512-BF16 without AMX
        "bf16-mixed", f"native bf16 CPU (avx512_bf16), d_model {wide} >= {wide}")
    for cpuinfo in (CPUINFO_SPR, CPUINFO_ZEN4):
        precision, why = R.auto_precision(False, wide // 2, cpuinfo=cpuinfo)
        assert precision == "32-true" and "ran slower" in why  # casts outweigh the GEMMs there
    assert R.auto_precision(False, 4 * wide, cpuinfo=CPUINFO_ZEN3) == (
        "32-true", "this CPU has no native bf16")
    assert R.auto_precision(True, 8, gpu_bf16=True)[0] == "bf16-mixed"
    assert R.auto_precision(True, 8, gpu_bf16=False)[0] == "32-true"


def test_auto_precision_is_resolved_into_the_spec_and_the_saved_config() -> None:
    """What a CPU run with trainer.precision=auto records is what it runs: the spec, the config
    that is saved and logged, and the banner's reason all say the same, on this machine's CPU."""
    from scalelab.cli.train import _check_runtime_keys
    from scalelab.config.spec import build_spec

    for d_model in (R.AUTO_BF16_MIN_D_MODEL // 2, R.AUTO_BF16_MIN_D_MODEL):
        cfg = _cfg(["trainer.precision=auto", f"model.d_model={d_model}", "model.n_heads=4"])
        spec = build_spec(cfg)
        _check_runtime_keys(cfg, spec)
        expected, why = R.auto_precision(False, d_model)
        assert spec.trainer.precision == cfg.trainer.precision == expected
        assert spec.precision_auto == why
    assert _spec([]).trainer.precision == "auto"  # the CPU default


def _cfg(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from scalelab.config import schema
    from scalelab.config.compose import normalize_overrides
    from scalelab.paths import conf_dir

    schema.register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("train", overrides=normalize_overrides(overrides))


def _spec(overrides: list[str]):
    from scalelab.config.spec import build_spec

    return build_spec(_cfg(overrides))


def test_a_run_splits_the_cores_between_its_ranks_and_the_sweep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP on CPU: each rank gets cores // ranks, exported so Lightning's launcher and the
    ranks it starts keep it; OMP_NUM_THREADS and train.num_threads win over the rule."""
    import functools

    from scalelab.cli.torch_setup import run_threads

    idle_8 = functools.partial(R.thread_plan, cores=8, load=0.0)
    ddp2 = _spec(["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(R.CONCURRENT_ENV, raising=False)
    assert run_threads(_spec([]), idle_8) == 8
    assert "OMP_NUM_THREADS" not in os.environ  # one process: nothing to hand on
    assert run_threads(ddp2, idle_8) == 4 and os.environ["OMP_NUM_THREADS"] == "4"
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv(R.CONCURRENT_ENV, "2")  # and 2 sweep points at once
    assert run_threads(ddp2, idle_8) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run_threads(_spec([]), idle_8) == 3
    assert run_threads(_spec(["train.num_threads=5"]), idle_8) == 5


def test_threads_adapt_mid_run_only_where_scalelab_chose_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from scalelab.cli.torch_setup import adapts_threads
    from scalelab.cli.trainer_build import scalelab_callbacks
    from scalelab.training.threads import AdaptiveThreads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spec = _spec([])
    assert adapts_threads(spec)
    assert any(isinstance(c, AdaptiveThreads) for c in scalelab_callbacks(spec, Path("unused"), {}, []))
    assert not adapts_threads(_spec(["train.num_threads=2"]))  # fixed by hand
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torchrun's convention, and ours for DDP ranks
    assert not adapts_threads(_spec([]))


def test_the_banner_says_whether_the_threads_follow_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from scalelab.cli.banner import threads_line

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv(R.CONCURRENT_ENV, "1")
    cores, threads = R.available_cores(), torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # started beside other work: it may take the cores back
        assert f"1 torch threads, following the load between 1 and {cores}," in threads_line(True)
        assert "1 torch threads, OMP_WAIT_POLICY" in threads_line(False)  # fixed by hand
        monkeypatch.setenv(R.CONCURRENT_ENV, str(cores))  # one core each: nothing to follow
        assert "1 torch threads, OMP_WAIT_POLICY" in threads_line(True)
    finally:
        torch.set_num_threads(threads)


def test_the_ceiling_is_what_an_idle_machine_gives_unless_the_threads_wait_passive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert R.thread_ceiling(1, cores=4, concurrent=1) == 4  # started busy, may grow back
    assert R.thread_ceiling(2, cores=8, concurrent=2) == 4
    assert R.thread_ceiling(3, cores=2, concurrent=1) == 3  # never below the start
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # 2 PASSIVE threads run as slow as 1
    assert R.thread_ceiling(1, cores=4, concurrent=1) == 1


def test_startup_gc_pause_freezes_what_startup_built_and_a_job_end_releases_it() -> None:
    """scalelab-train's entry point: no cyclic collection during imports, the start-up heap
    out of the collector's reach while training, and collectable again when the job ends."""
    import gc

    assert gc.isenabled()
    try:
        R.pause_gc_for_startup()
        assert not gc.isenabled()
        built = [[] for _ in range(1000)]  # start-up's long-lived objects
        R.resume_gc_after_startup()
        assert gc.isenabled() and gc.get_freeze_count() >= len(built)
        R.release_frozen_heap()
        assert gc.get_freeze_count() == 0
        R.resume_gc_after_startup()  # not paused (a test, a 2nd job): nothing is frozen
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        gc.enable()



_MMAPPED_4MB = """
import ctypes, sys
if sys.argv[1] == "cli":
    import scalelab.cli  # what every scalelab command imports first
elif sys.argv[1] == "tuned":
    from scalelab import runtime
    assert runtime.keep_freed_memory()
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype, libc.malloc.restype, libc.free.argtypes = MallInfo2, ctypes.c_void_p, [ctypes.c_void_p]
before = libc.mallinfo2().hblkhd
block = libc.malloc(4 << 20)
print(libc.mallinfo2().hblkhd - before)  # bytes glibc mapped for it apart from the heap
libc.free(block)
"""


def _mapped_apart(mode: str, **env: str) -> int:
    return int(subprocess.run([sys.executable, "-c", _MMAPPED_4MB, mode], capture_output=True,
                              text=True, timeout=120, env={**os.environ, **env}, check=True).stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_tuned_heap_serves_large_blocks_itself() -> None:
    """glibc maps a 4 MiB block apart from its heap by default (and unmaps it when freed, so the
    next one faults in again); tuned, the heap serves it. A user's own settings are kept."""
    assert _mapped_apart("default") >= 4 << 20
    assert _mapped_apart("tuned") == 0
    assert _mapped_apart("cli") == 0  # every scalelab command
    assert _mapped_apart("cli", MALLOC_TRIM_THRESHOLD_="131072") >= 4 << 20
    assert _mapped_apart("cli", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072") >= 4 << 20
    assert _mapped_apart("cli", GLIBC_TUNABLES="glibc.cpu.x86_shstk=off") == 0  # not about malloc
