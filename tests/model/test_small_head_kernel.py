"""scalelab's small-head attention kernel (model/small_head_attention.c) on its own: SDPA's results
at the edges of what it takes, on torch's threads, its limits, and the fallback when it cannot
be built."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from scalelab.model import cpu_kernels, small_head_kernel

pytestmark = pytest.mark.skipif(
    not cpu_kernels.SUPPORTED or shutil.which(os.environ.get("CC") or "cc") is None,
    reason="the kernel is built with a C compiler on Linux x86-64")


@pytest.fixture(scope="module", autouse=True)
def _kernel() -> None:
    assert small_head_kernel.library() is not None, "the kernel did not build here: see the warning"


def _model_layout(b: int, t: int, h: int, hkv: int, hd: int, seed: int = 0) -> list[torch.Tensor]:
    """q [B, H, T, hd], k and v [B, Hkv, T, hd] as the model has them: strided views of one
    projection's output [B, T, (H + 2 Hkv) hd]."""
    fused = torch.randn(b, t, (h + 2 * hkv) * hd, generator=torch.Generator().manual_seed(seed))
    q, k, v = fused.split([h * hd, hkv * hd, hkv * hd], dim=-1)
    return [x.view(b, t, -1, hd).transpose(1, 2).detach().requires_grad_() for x in (q, k, v)]


def _against_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                  causal: bool, scale: float | None = None, dy: torch.Tensor | None = None) -> None:
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    ours = small_head_kernel.attention(q, k, v, mask, causal, scale)
    want = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])
    torch.testing.assert_close(ours, want, atol=2e-5, rtol=1e-5)
    dy = torch.randn_like(want) if dy is None else dy
    ours.backward(dy)
    want.backward(dy)
    for mine, theirs in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(("b", "t", "h", "hkv", "hd"), [
    (7, 64, 3, 3, 4),  # the bench's sweep point
    (2, 37, 4, 2, 5),  # queries past a block (16 or 8), GQA, a head_dim without its own loop
    (1, 256, 2, 1, 16),  # the kernel's limits: 256 keys, head_dim 16
    (3, 1, 2, 2, 8),  # one query
])
@pytest.mark.parametrize("causal", [True, False])
def test_it_equals_sdpa_at_the_edges_of_what_it_takes(b: int, t: int, h: int, hkv: int, hd: int,
                                                      causal: bool, kernel_arch: str) -> None:
    _against_sdpa(*_model_layout(b, t, h, hkv, hd), None, causal)


@pytest.mark.parametrize("threads", [1, 2])
def test_it_runs_on_torchs_threads_to_the_same_result(threads: int, kernel_arch: str) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v = _model_layout(9, 48, 4, 2, 8, seed=1)  # 18 (batch, K/V head) units to share
        mask = torch.randn(9, 1, 48, 48)
        mask[:, :, :, -7:] = -1e9  # the last keys are padding
        _against_sdpa(q, k, v, mask, False, scale=0.3)
    finally:
        torch.set_num_threads(before)


def test_a_gradient_read_through_zero_strides(kernel_arch: str) -> None:
    """``loss = y.sum()`` hands backward an expanded gradient (every stride 0)."""
    q, k, v = _model_layout(2, 20, 3, 3, 4, seed=2)
    _against_sdpa(q, k, v, None, True, dy=torch.ones(1).expand(2, 3, 20, 4))


def test_a_query_that_sees_no_key_gets_zeros(kernel_arch: str) -> None:
    q, k, v = _model_layout(1, 8, 1, 1, 4, seed=3)
    mask = torch.zeros(1, 1, 8, 8)
    mask[0, 0, 2] = float("-inf")  # query 2 sees nothing
    y = small_head_kernel.attention(q, k, v, mask, False, None)
    y.backward(torch.ones_like(y))
    assert torch.equal(y[0, 0, 2], torch.zeros(4))
    assert torch.equal(q.grad[0, 0, 2], torch.zeros(4))
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize(("t", "hd"), [(257, 4), (8, 17)], ids=["keys", "head_dim"])
def test_beyond_its_limits_it_refuses_and_says_which(t: int, hd: int) -> None:
    q, k, v = _model_layout(1, t, 1, 1, hd)
    with pytest.raises(RuntimeError, match="head_dim <= 16, keys <= 256"):
        small_head_kernel.attention(q, k, v, None, True, None)


def _run(code: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SCALELAB_KERNEL_CACHE": str(cache), **env})


# q, k, v as a sweep point's; the model's choice of path is asked as the model asks it
_FALLBACK = ("import logging, torch, torch.nn.functional as F; logging.basicConfig(level=logging.INFO);"
             "from scalelab.model import small_head_attention as sha; sha.MODE = 'on';"
             "torch.set_num_threads(1); x = torch.randn(2, 16, 3, 3, 4);"
             "q, k, v = (x[:, :, i].transpose(1, 2).requires_grad_() for i in range(3));"
             "assert sha.chosen(q, k, None, True, 0.0) and not sha.kernel_runs();"
             "y = sha.attention(q, k, v, None, True, None);"
             "assert type(y.grad_fn).__name__.startswith('ViewBackward');"  # the matmuls' view
             "torch.testing.assert_close(y, F.scaled_dot_product_attention(q, k, v, is_causal=True))")


def test_without_a_compiler_the_matmul_path_runs_after_one_warning(tmp_path: Path) -> None:
    proc = _run(_FALLBACK, tmp_path / "cache", CC=str(tmp_path / "no-such-cc"))
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "attention (small heads)" in ln]
    assert len(warnings) == 1 and "no-such-cc" in warnings[0], proc.stderr
    assert "SDPA or the batched-matmul path runs" in warnings[0]
    assert not any((tmp_path / "cache").iterdir())  # nothing half-built left behind


def test_it_can_be_turned_off(tmp_path: Path) -> None:
    proc = _run(_FALLBACK, tmp_path, SCALELAB_FAST_ATTENTION="0")
    assert proc.returncode == 0, proc.stderr
    assert not any(tmp_path.iterdir())


def test_its_limits_are_the_c_files_and_cover_the_paths() -> None:
    source = small_head_kernel.KERNEL.source.read_text()
    assert f"#define MAX_HD {small_head_kernel.MAX_HEAD_DIM}\n" in source
    assert f"#define MAX_T {small_head_kernel.MAX_KEYS}\n" in source
    from scalelab.model import small_head_attention as sha

    assert sha.MAX_HEAD_DIM <= small_head_kernel.MAX_HEAD_DIM and sha.MAX_SEQ <= small_head_kernel.MAX_KEYS
