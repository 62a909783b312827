"""scalelab's one-pass tanh GELU (model/gelu_tanh.c) equals torch's to float rounding, is what the
GELU MLPs run, is built once per cache and CPU, and falls back to torch's with one warning."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from scalelab.model import Transformer, cpu_kernels, fast_gelu

from .helpers import tiny

pytestmark = pytest.mark.skipif(
    not cpu_kernels.SUPPORTED or shutil.which(os.environ.get("CC") or "cc") is None,
    reason="the kernel is built with a C compiler on Linux x86-64")

# -inf is apart: torch's form gives NaN (-inf * 0), the kernel's -inf (see gelu_tanh.c)
SPECIAL = [0.0, -0.0, float("inf"), float("nan"), 1e-30, -1e-30, 8.0, -8.0, 30.0, -30.0, 1e4, -1e4]
CLAMP = 2e-35  # exp's argument stops at 80: x < -10 gives x * 1.8e-35 for a value smaller still
RUN_MIN_ELEMENTS = fast_gelu.MIN_ELEMENTS  # what a run uses (the tests below lower it to 0)


@pytest.fixture(scope="module", autouse=True)
def _kernel() -> None:
    assert fast_gelu.library() is not None, "the kernel did not build here: see the warning"


@pytest.fixture(autouse=True)
def _any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel for the small tensors here too (a run takes it from MIN_ELEMENTS up)."""
    monkeypatch.setattr(fast_gelu, "MIN_ELEMENTS", 0)


def test_small_tensors_take_torchs_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast_gelu, "MIN_ELEMENTS", RUN_MIN_ELEMENTS)
    small = torch.randn(448, 48, requires_grad=True)  # a sweep point's MLP activation
    large = torch.randn(768, 512, requires_grad=True)  # shakespeare_char's
    assert type(fast_gelu.gelu_tanh(small).grad_fn).__name__ == "GeluBackward0"
    assert type(fast_gelu.gelu_tanh(large).grad_fn).__name__ == "_GeluTanhBackward"


def _run(code: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SCALELAB_KERNEL_CACHE": str(cache), **env})


@pytest.mark.parametrize("threads", [1, 2])
def test_values_and_gradients_equal_torchs_in_fp32(threads: int, kernel_arch: str) -> None:
    torch.set_num_threads(threads)  # 2: the parallel loop (from 32,768 elements)
    x = torch.cat([torch.randn(300, 256) * 4, torch.tensor(SPECIAL).repeat(256)[: 256 * 2].view(2, 256)])
    x.requires_grad_()
    grad = torch.randn_like(x)
    ours = fast_gelu.gelu_tanh(x)
    (ours_dx,) = torch.autograd.grad(ours, x, grad)
    theirs = F.gelu(x, approximate="tanh")
    (theirs_dx,) = torch.autograd.grad(theirs, x, grad)
    assert ours.grad_fn is not None and type(ours.grad_fn).__name__ == "_GeluTanhBackward"
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(ours_dx, theirs_dx, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_special_values_and_the_far_tail(kernel_arch: str) -> None:
    x = torch.tensor(SPECIAL)
    ours = fast_gelu.gelu_tanh(x)
    torch.testing.assert_close(ours, F.gelu(x, approximate="tanh"), equal_nan=True, rtol=1e-6, atol=1e-20)
    # 0.5 x (1 + tanh u) = x sigmoid(2u): at x = -8 torch's form cancels to 0, where the value is
    # -3.1e-21; in float64, with the same identity, the kernel's value holds to 2e-5 (exp(-49)
    # turns a float's 1e-7 in its argument into 5e-6), or to the clamp's 2e-35 |x|
    xd, exact = x.double(), _exact(x.double())
    finite = exact.isfinite()
    err = (ours.double() - exact).abs()[finite]
    assert (err <= 2e-5 * exact.abs()[finite] + CLAMP * xd.abs()[finite]).all()
    assert ours[SPECIAL.index(-8.0)] < 0
    assert fast_gelu.gelu_tanh(torch.tensor([float("-inf")])).item() == float("-inf")


def _exact(x: torch.Tensor) -> torch.Tensor:
    """In float64 and in the sigmoid form, which keeps the far negative tail (no 1 + tanh u)."""
    return x * torch.sigmoid(2 * (2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3))


def test_bf16_is_computed_in_fp32_and_rounded_once(kernel_arch: str) -> None:
    x = (torch.randn(64, 512) * 3).bfloat16().requires_grad_()
    grad = torch.randn(64, 512).bfloat16()
    ours = fast_gelu.gelu_tanh(x)
    (ours_dx,) = torch.autograd.grad(ours, x, grad)
    assert ours.dtype == ours_dx.dtype == torch.bfloat16
    xd = x.detach().double().requires_grad_()
    exact = _exact(xd)
    (exact_dx,) = torch.autograd.grad(exact, xd, grad.double())
    # one rounding of an fp32 value: within half a bf16 ulp (2^-8 relative) of the exact one
    # (a little more for the gradient, a product of two), or within the clamp's 2e-35 |x|
    tail = CLAMP * (xd.detach().abs() + 1) ** 3
    assert ((ours.double() - exact).abs() <= exact.abs() * 2**-8 + tail).all()
    assert ((ours_dx.double() - exact_dx).abs() <= exact_dx.abs() * 2**-7 + tail).all()
    # torch's kernel rounds the same function once too: mostly the same bits
    assert (ours == F.gelu(x, approximate="tanh")).float().mean() > 0.85


def test_second_derivatives_are_torchs() -> None:
    """Under create_graph (a Hessian-vector product) the backward is torch's differentiable op."""
    x = (torch.randn(64, 32) * 2).requires_grad_()
    grads = []
    for fn in (fast_gelu.gelu_tanh, lambda t: F.gelu(t, approximate="tanh")):
        (dx,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
        (ddx,) = torch.autograd.grad(dx.sum(), x)
        grads.append((dx, ddx))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_without_grad_no_graph_is_recorded() -> None:
    x = torch.cat([torch.randn(2047), torch.tensor([-8.0])]).requires_grad_()
    with torch.no_grad():
        y = fast_gelu.gelu_tanh(x)
    assert y.grad_fn is None and not y.requires_grad
    torch.testing.assert_close(y, F.gelu(x.detach(), approximate="tanh"))
    assert y[-1] < 0  # the kernel's tail (torch's form gives 0 at -8): the kernel ran


def test_a_strided_input_is_read_in_its_logical_order() -> None:
    x = torch.randn(512, 96).t()
    assert not x.is_contiguous()
    torch.testing.assert_close(fast_gelu.gelu_tanh(x), F.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("mlp", ["gelu", "geglu"])
def test_the_tanh_gelu_mlps_train_through_the_kernel(mlp: str) -> None:
    model = Transformer(tiny(mlp=mlp))
    loss = model(torch.randint(0, 37, (2, 16))).logsumexp(-1).mean()
    nodes, seen = [loss.grad_fn], set()
    while nodes:
        node = nodes.pop()
        if node is not None and node not in seen:
            seen.add(node)
            nodes.extend(n for n, _ in node.next_functions)
    assert sum(type(n).__name__ == "_GeluTanhBackward" for n in seen) == 2  # one a layer
    loss.backward()


@pytest.mark.parametrize(("threads", "started"), [(1, 0), (2, 1)])
def test_it_runs_on_torchs_thread_count(tmp_path: Path, threads: int, started: int) -> None:
    """torch keeps its thread count apart from OpenMP's default (every core): a sweep's
    one-thread process must not start a second thread for the kernel; with 2, it starts one."""
    code = ("import os, numpy, torch; from scalelab.model import fast_gelu as g;"
            f"torch.set_num_threads({threads}); g.library();"
            "x = torch.from_numpy(numpy.full(1 << 20, 0.5, numpy.float32));"  # no torch kernel yet
            "before = len(os.listdir('/proc/self/task')); [g.gelu_tanh(x) for _ in range(3)];"
            "print(before, len(os.listdir('/proc/self/task')))")
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split())
    assert after == before + started


def test_it_is_built_once_and_loaded_by_later_processes(tmp_path: Path) -> None:
    code = ("import torch; from scalelab.model import fast_gelu as g; assert g.library() is not None;"
            "from scalelab.model.cpu_kernels import built; print(built(g.KERNEL))")
    first = _run(code, tmp_path)
    assert first.returncode == 0, first.stderr
    built = Path(first.stdout.strip())
    assert built.parent == tmp_path and built.suffix == ".so"
    stamp = built.stat().st_mtime_ns
    second = _run(code, tmp_path)
    assert second.returncode == 0, second.stderr
    assert Path(second.stdout.strip()) == built and built.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no temporary file left


def test_processes_that_start_together_each_load_a_whole_library(tmp_path: Path) -> None:
    code = ("import torch; from scalelab.model import fast_gelu as g; g.MIN_ELEMENTS = 0;"
            "x = torch.randn(9); assert g.library() is not None;"
            "torch.testing.assert_close(g.gelu_tanh(x), torch.nn.functional.gelu(x, approximate='tanh'))")
    env = {**os.environ, "SCALELAB_KERNEL_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        errors = [p.communicate(timeout=300)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], errors
    finally:
        for p in procs:
            p.kill()
    assert len(list(tmp_path.iterdir())) == 1


def test_without_a_compiler_torchs_kernel_runs_after_one_warning(tmp_path: Path) -> None:
    code = ("import logging, torch; logging.basicConfig(level=logging.INFO);"
            "from scalelab.model import fast_gelu as g; g.MIN_ELEMENTS = 0; x = torch.randn(9);"
            "y = [g.gelu_tanh(x) for _ in range(3)][-1];"
            "assert g.library() is None; assert torch.equal(y, torch.nn.functional.gelu(x, approximate='tanh'))")
    proc = _run(code, tmp_path / "cache", CC=str(tmp_path / "no-such-cc"))
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "GELU" in ln]
    assert len(warnings) == 1 and "torch's kernel runs" in warnings[0] and "no-such-cc" in warnings[0]
    assert not any((tmp_path / "cache").iterdir())  # nothing half-built left behind


def test_it_can_be_turned_off(tmp_path: Path) -> None:
    code = "from scalelab.model import fast_gelu as g; assert g.library() is None"
    proc = _run(code, tmp_path, SCALELAB_FAST_GELU="0")
    assert proc.returncode == 0, proc.stderr
    assert not any(tmp_path.iterdir())
