"""The thread rule and CPU bf16 detection (scalelab.runtime), as a run applies them."""

from __future__ import annotations

import os

import pytest

from scalelab import runtime as R


def test_a_process_takes_every_core_it_may_use() -> None:
    plan = R.thread_plan(concurrent=1, cores=8)
    assert (plan.threads, plan.cores, plan.concurrent) == (8, 8, 1)
    assert plan.describe() == "8 threads/process x 1 process(es) on 8 cores"


def test_concurrent_processes_split_the_cores() -> None:
    assert R.thread_plan(concurrent=2, cores=8).threads == 4
    assert R.thread_plan(concurrent=3, cores=8).threads == 2
    assert R.thread_plan(concurrent=16, cores=8).threads == 1  # never below 1


def test_concurrency_comes_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(R.CONCURRENT_ENV, "4")
    assert R.concurrent_processes() == 4
    assert R.thread_plan(cores=8).threads == 2
    monkeypatch.setenv(R.CONCURRENT_ENV, "junk")
    assert R.concurrent_processes() == 1


def test_sweep_jobs_and_threads_follow_the_same_rule() -> None:
    assert R.jobs_and_threads(2, cores=2) == (2, 1)
    assert R.jobs_and_threads(2, cores=16) == (2, 8)
    assert R.jobs_and_threads(8, cores=2) == (2, 1)  # capped at the cores
    assert R.jobs_and_threads(-1, cores=4) == (4, 1)  # joblib's -1: one job per core


def test_available_cores_is_the_affinity() -> None:
    assert R.available_cores() == len(os.sched_getaffinity(0))


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

    on_8 = functools.partial(R.thread_plan, cores=8)
    ddp2 = _spec(["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(R.CONCURRENT_ENV, raising=False)
    assert run_threads(_spec([]), on_8) == 8
    assert "OMP_NUM_THREADS" not in os.environ  # one process: nothing to hand on
    assert run_threads(ddp2, on_8) == 4 and os.environ["OMP_NUM_THREADS"] == "4"
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv(R.CONCURRENT_ENV, "2")  # and 2 sweep points at once
    assert run_threads(ddp2, on_8) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert run_threads(_spec([]), on_8) == 3
    assert run_threads(_spec(["train.num_threads=5"]), on_8) == 5


def test_the_banner_says_how_many_threads_and_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from scalelab.cli.banner import threads_line

    monkeypatch.setenv(R.CONCURRENT_ENV, "3")
    cores, threads = R.available_cores(), torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert threads_line() == (f"2 torch threads ({cores} cores, 3 scalelab process(es) "
                                  "sharing them)")
    finally:
        torch.set_num_threads(threads)
