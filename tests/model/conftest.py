"""Seed every model test and run it on one thread.

The models here are tiny: with several threads on a busy 2-core machine, thread
synchronisation costs more than the maths (measured: ~5x slower), so each test runs
single-threaded and restores the previous setting afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from scalelab.model import cpu_kernels


@pytest.fixture(autouse=True)
def _seed_and_one_thread() -> Iterator[None]:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["native", "x86-64-v3", "x86-64-v2"])
def kernel_arch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """scalelab's CPU kernels built for this CPU, then for the x86-64 levels below AVX-512 (AVX2 and
    FMA; SSE4.2): the code other CPUs run, run here (cpu_kernels.ARCH_LEVELS)."""
    from scalelab.model import fast_gelu, small_head_kernel

    arch = request.param
    if arch != "native" and (missing := cpu_kernels.missing_flags(arch)):
        pytest.skip(f"this CPU cannot run {arch} code (no {' '.join(missing)})")
    monkeypatch.setenv(cpu_kernels.ARCH_SWITCH, arch)
    cpu_kernels.load.cache_clear()
    for kernel in (fast_gelu.KERNEL, small_head_kernel.KERNEL):  # a test must not pass on a fallback
        assert cpu_kernels.load(kernel) is not None, f"{kernel.name} did not build for {arch}"
    yield arch
    cpu_kernels.load.cache_clear()
