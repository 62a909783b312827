"""Thread rule, OpenMP policy and CPU bf16 detection (scalelab.runtime)."""

from __future__ import annotations

import os
import subprocess
import sys

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
    plan = R.thread_plan(concurrent=1, cores=2, load=1.0)  # one other busy process
    assert (plan.threads, plan.wait_policy) == (1, "PASSIVE")
    plan = R.thread_plan(concurrent=1, cores=8, load=4.0)
    assert (plan.threads, plan.wait_policy) == (4, "PASSIVE")
    plan = R.thread_plan(concurrent=1, cores=2, load=9.0)  # far oversubscribed
    assert (plan.threads, plan.wait_policy) == (1, "PASSIVE")


def test_oversubscribed_by_our_own_jobs_is_passive() -> None:
    assert R.thread_plan(concurrent=4, cores=2, load=0.0).wait_policy == "PASSIVE"


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
    # 64 processes on this machine's cores: oversubscribed whatever the load, so PASSIVE,
    # even though the parent had set (and marked) another value
    assert _child_policy({"OMP_WAIT_POLICY": "ACTIVE", "SCALELAB_OMP_AUTO": "1",
                          R.CONCURRENT_ENV: "64"}) == "PASSIVE"


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
