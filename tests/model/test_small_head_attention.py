"""The CPU small-head attention path equals SDPA (outputs and gradients), may apply only where it
was measured to win on some CPU, and is taken only where it times faster on this one. Every test
runs twice: through scalelab's kernel and through the batched-matmul path it falls back to."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from scalelab.model import ModelConfig, Transformer, cpu_kernels
from scalelab.model import small_head_attention as sha
from scalelab.model.transformer import MASK_VALUE

PATH_NODES = ("_SmallHeadAttention", "_KernelAttention")  # the two paths' autograd nodes
CAN_BUILD = cpu_kernels.SUPPORTED and shutil.which(os.environ.get("CC") or "cc") is not None


@pytest.fixture(autouse=True, params=[
    pytest.param("kernel", marks=pytest.mark.skipif(not CAN_BUILD, reason="needs a C compiler on Linux x86-64")),
    "matmuls"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(sha, "USE_KERNEL", request.param == "kernel")
    assert sha.kernel_runs() == (request.param == "kernel"), "the kernel did not build: see the warning"
    return str(request.param)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The path is for one thread a process (a CPU sweep point's setting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def path_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the path wherever it applies, whatever this CPU's timing says."""
    monkeypatch.setattr(sha, "MODE", "on")


@pytest.fixture
def fresh_timings(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[object, ...], bool]:
    monkeypatch.setattr(sha, "MODE", "measure")
    monkeypatch.setattr(sha, "_FASTER", {})
    monkeypatch.setattr(sha, "_BY_SHAPE", {})
    return sha._FASTER


def _inputs(b: int, h: int, hkv: int, tq: int, tk: int, hd: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, n, t, hd, generator=g, requires_grad=True)
            for n, t in ((h, tq), (hkv, tk), (hkv, tk))]


def _padding_mask(b: int, tq: int, tk: int) -> torch.Tensor:
    keep = torch.ones(b, tk, dtype=torch.bool)
    keep[0, -3:] = False  # the first row's last three keys are padding
    return torch.where(keep[:, None, None, :], 0.0, MASK_VALUE).expand(b, 1, tq, tk)


def _alibi_like(h: int, tq: int, tk: int) -> torch.Tensor:
    dist = (torch.arange(tk)[None, :] - torch.arange(tq)[:, None]).abs().float()
    return (-torch.linspace(0.1, 1.0, h)[:, None, None] * dist)[None]


CASES = {
    "causal": dict(hkv=3, tq=16, tk=16, causal=True, mask=None),
    "bidirectional": dict(hkv=3, tq=16, tk=16, causal=False, mask=None),
    "padding": dict(hkv=3, tq=16, tk=16, causal=False, mask="padding"),
    "per-head bias": dict(hkv=3, tq=16, tk=16, causal=False, mask="alibi"),
    "gqa causal": dict(hkv=1, tq=16, tk=16, causal=True, mask=None),
    "causal, fewer queries than keys": dict(hkv=3, tq=8, tk=16, causal=True, mask=None),
    "decode step (past keys)": dict(hkv=3, tq=1, tk=9, causal=False, mask="padding"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("scale", [None, 0.3])
def test_outputs_and_gradients_equal_sdpa(case: str, scale: float | None, one_thread: None) -> None:
    c = CASES[case]
    b, h, hd = 2, 3, 4
    tq, tk, hkv = c["tq"], c["tk"], c["hkv"]
    mask = {None: None, "padding": _padding_mask(b, tq, tk), "alibi": _alibi_like(h, tq, tk)}[c["mask"]]
    q, k, v = _inputs(b, h, hkv, tq, tk, hd)
    assert sha.applies(q, k, 0.0)
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ours = sha.attention(q, k, v, mask, c["causal"], scale)
    want = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask, is_causal=c["causal"],
                                          scale=scale, enable_gqa=hkv != h)
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(want)
    ours.backward(dy)
    want.backward(dy)
    for mine, theirs in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)


def test_it_may_apply_only_where_it_was_measured_to_win(one_thread: None) -> None:
    q, k, _ = _inputs(2, 3, 3, 16, 16, 8)
    assert sha.applies(q, k, 0.0)
    assert not sha.applies(q, k, 0.1), "dropout goes to SDPA"
    with torch.no_grad():
        assert not sha.applies(q, k, 0.0), "a forward alone is faster in SDPA"
    assert not sha.applies(q.detach(), k.detach(), 0.0), "no gradient wanted"
    torch.set_num_threads(2)
    # with 2 threads flash parallelizes better than the matmuls; the kernel runs on them too
    assert sha.applies(q, k, 0.0) == sha.kernel_runs()
    torch.set_num_threads(1)
    wide, _, _ = _inputs(2, 3, 3, 16, 16, 16)
    assert not sha.applies(wide, wide, 0.0), "head_dim 16: SDPA is as fast"
    long_q, long_k, _ = _inputs(1, 1, 1, 1, sha.MAX_SEQ + 1, 4)
    assert not sha.applies(long_q, long_k, 0.0), "the scores would be too large to keep"
    assert not sha.applies(q.bfloat16(), k.bfloat16(), 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not sha.applies(q, k, 0.0)


@pytest.mark.parametrize(("d_model", "dropout", "possible"),
                         [(12, 0.0, True), (48, 0.0, False), (12, 0.1, False)],
                         ids=["head_dim 4", "head_dim 16", "dropout"])
def test_a_layer_that_can_never_take_it_skips_the_per_call_tests(
        d_model: int, dropout: float, possible: bool, path_on: None, one_thread: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = Transformer(ModelConfig(vocab_size=50, max_seq_len=32, d_model=d_model, n_layers=2,
                                    n_heads=3, dropout=dropout))
    asked = []
    monkeypatch.setattr(sha, "applies", lambda *a: asked.append(a) or False)
    for _ in range(2):
        model(torch.randint(0, 50, (2, 32)))
    assert len(asked) == (2 if possible else 0)  # one question a forward, or none at all


def test_a_shape_timed_slower_is_answered_without_the_other_tests(
        fresh_timings: dict[tuple[object, ...], bool], monkeypatch: pytest.MonkeyPatch,
        one_thread: None) -> None:
    monkeypatch.setattr(sha, "MARGIN", float("inf"))  # every timing says SDPA
    model = Transformer(ModelConfig(vocab_size=50, max_seq_len=32, d_model=12, n_layers=2, n_heads=3))
    ids = torch.randint(0, 50, (4, 32), generator=torch.Generator().manual_seed(5))
    assert not _graph_takes_path(model, ids)
    assert list(fresh_timings.values()) == [False]
    asked = []
    monkeypatch.setattr(sha, "applies", lambda *a: asked.append(a) or True)
    assert not _graph_takes_path(model, ids)
    assert asked == []
    assert _graph_takes_path(model, ids[:2]) is False and len(asked) == 1  # a new shape asks


def _graph_names(t: torch.Tensor) -> set[str]:
    seen, todo = set(), [t.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return {type(fn).__name__ for fn in seen}


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_a_small_head_transformer_trains_the_same_either_way(
        arch: str, monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    """d=12, 3 heads (a CPU sweep point's shape): same loss and gradients with the path on and
    off, and the path is really what runs when on."""
    cfg = ModelConfig(arch=arch, vocab_size=50, max_seq_len=32, d_model=12, n_layers=2, n_heads=3)
    ids = torch.randint(0, 50, (4, 32), generator=torch.Generator().manual_seed(1))
    results = {}
    for enabled in (True, False):
        monkeypatch.setattr(sha, "MODE", "on" if enabled else "off")
        torch.manual_seed(0)
        model = Transformer(cfg)
        keep = torch.ones(4, 32, dtype=torch.bool)
        keep[1, -5:] = False
        logits = model(ids, attention_mask=keep if arch == "encoder" else None)
        names = _graph_names(logits)
        assert _takes(names) == enabled, names
        loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        results[enabled] = (loss.detach(), [p.grad for p in model.parameters()])
    torch.testing.assert_close(results[True][0], results[False][0])
    for a, b in zip(results[True][1], results[False][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_activation_checkpointing_recomputes_it_to_the_same_gradients(one_thread: None, path_on: None) -> None:
    cfg = ModelConfig(arch="decoder", vocab_size=50, max_seq_len=32, d_model=12, n_layers=2, n_heads=3)
    ids = torch.randint(0, 50, (4, 32), generator=torch.Generator().manual_seed(2))
    grads = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = Transformer(cfg)
        model.set_activation_checkpointing(checkpointing)
        logits = model(ids)
        assert _takes(_graph_names(logits))
        F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
        grads[checkpointing] = [p.grad for p in model.parameters()]
    for a, b in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(a, b)


def test_a_compiled_model_keeps_sdpa_on_one_thread(one_thread: None) -> None:
    """Under torch.compile (here with one compiled block for every layer, which failed to trace
    while the path's thread test ran inside it) inductor gets SDPA to fuse, not this path."""
    from torch._dynamo.backends.registry import lookup_backend

    cfg = ModelConfig(arch="decoder", vocab_size=50, max_seq_len=32, d_model=12, n_layers=2, n_heads=3)
    model = Transformer(cfg)
    model.set_block_regions(True)
    ids = torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(3))
    code: list[str] = []

    def capture(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        code.append(gm.print_readable(print_output=False))  # the block's subgraph included
        return lookup_backend("aot_eager")(gm, inputs)

    logits = torch.compile(model, backend=capture, fullgraph=True)(ids)
    logits.float().sum().backward()
    assert len(code) == 1 and "scaled_dot_product_attention" in code[0]
    assert not any(node in code[0] for node in PATH_NODES)
    assert all(p.grad is not None for p in model.parameters())


def _graph_takes_path(model: Transformer, ids: torch.Tensor) -> bool:
    logits = model(ids)
    F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    return _takes(_graph_names(logits))


def _takes(names: set[str]) -> bool:
    return any(n.startswith(PATH_NODES) for n in names)


@pytest.mark.parametrize("margin", [0.0, float("inf")], ids=["always faster", "never faster"])
def test_measured_it_is_taken_where_it_times_faster_once_a_shape(
        margin: float, fresh_timings: dict[tuple[object, ...], bool],
        monkeypatch: pytest.MonkeyPatch, one_thread: None, caplog: pytest.LogCaptureFixture) -> None:
    # Real timings of both paths; the margin decides which way any timing falls.
    monkeypatch.setattr(sha, "MARGIN", margin)
    model = Transformer(ModelConfig(vocab_size=50, max_seq_len=32, d_model=12, n_layers=2, n_heads=3))
    rng = torch.get_rng_state()
    with caplog.at_level(logging.INFO, logger=sha.__name__):
        for batch, length in ((4, 32), (4, 32), (2, 32), (4, 27)):
            ids = torch.randint(0, 50, (batch, length), generator=torch.Generator().manual_seed(batch))
            assert _graph_takes_path(model, ids) == (margin == 0.0)
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in said] == ["attention, q 4x3x32x4", "attention, q 2x3x32x4"]
    assert all(m.endswith("so it runs" if margin == 0.0 else "so SDPA runs") for m in said)
    # timed twice: 4 x 3 and 2 x 3 heads are two classes; 27 positions fall in 32's class
    assert sorted(fresh_timings) == [(n, 32, 32, 4, 1, None, True, sha.kernel_runs(), 1) for n in (8, 16)]
    assert set(fresh_timings.values()) == {margin == 0.0}
    assert torch.equal(torch.get_rng_state(), rng)  # timing drew nothing from the run's stream


def test_timed_inside_activation_checkpointing_the_gradients_are_unchanged(
        fresh_timings: dict[tuple[object, ...], bool],
        monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    # The first forward of a shape runs its timing (forward and backward of its own) while the
    # checkpoint records its saved tensors: none of that may enter the checkpoint's graph.
    monkeypatch.setattr(sha, "MARGIN", 0.0)
    cfg = ModelConfig(arch="decoder", vocab_size=50, max_seq_len=32, d_model=12, n_layers=2, n_heads=3)
    ids = torch.randint(0, 50, (4, 32), generator=torch.Generator().manual_seed(2))
    grads = {}
    for checkpointing in (True, False):  # the checkpointed model first: it meets the shape first
        torch.manual_seed(0)
        model = Transformer(cfg)
        model.set_activation_checkpointing(checkpointing)
        F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        grads[checkpointing] = [p.grad for p in model.parameters()]
    assert list(fresh_timings.values()) == [True]
    for a, b in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_with_deterministic_algorithms_nothing_is_timed_and_sdpa_runs(
        fresh_timings: dict[tuple[object, ...], bool], monkeypatch: pytest.MonkeyPatch,
        one_thread: None) -> None:
    monkeypatch.setattr(sha, "MARGIN", 0.0)  # any timing would choose the path
    model = Transformer(ModelConfig(vocab_size=50, max_seq_len=32, d_model=12, n_layers=2, n_heads=3))
    ids = torch.randint(0, 50, (4, 32), generator=torch.Generator().manual_seed(4))
    torch.use_deterministic_algorithms(True)
    try:
        assert not _graph_takes_path(model, ids)
    finally:
        torch.use_deterministic_algorithms(False)
    assert fresh_timings == {}
    assert _graph_takes_path(model, ids)  # timed, and taken, once determinism is off
