"""FlatAdamW: one flat tensor per group trains as AdamW does and keeps AdamW's checkpoint layout."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from scalelab.data.datamodules import CausalLMDataModule
from scalelab.model import ModelConfig, Transformer
from scalelab.training import CausalLM, OptimConfig, build_optimizer, param_groups
from scalelab.training.flat_params import FlatAdamW, flatten_state

from .test_callbacks import T, V
from .test_checkpoint import _fit


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=V, max_seq_len=T, d_model=16, n_layers=2, n_heads=4,
                                   n_kv_heads=2, position="learned", bias=False))


def _pair(fused: bool) -> tuple[tuple[Transformer, torch.optim.Optimizer], ...]:
    """The same model under AdamW and under FlatAdamW (same groups and settings)."""
    sides = []
    for kind in (torch.optim.AdamW, FlatAdamW):
        model = _model()
        groups = param_groups(model, 0.1)[0]
        sides.append((model, kind(groups, lr=3e-2, betas=(0.9, 0.95), fused=fused)))
    return tuple(sides)


def _step(model: Transformer, opt: torch.optim.Optimizer, seed: int) -> float:
    """One step as Lightning takes it: clipping over the optimizer's own parameters."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (4, T), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 0.5)
    opt.step()
    return float(loss)


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("fused", [True, False])
def test_flat_adamw_trains_as_adamw_does(fused: bool) -> None:
    (plain, plain_opt), (flat, flat_opt) = _pair(fused)
    for seed in range(8):
        assert _step(plain, plain_opt, seed) == pytest.approx(_step(flat, flat_opt, seed), rel=1e-5)
    _assert_same_weights(plain, flat)
    # the module's parameters and gradients live in the flat tensors the optimizer steps
    for group in flat_opt.flat_groups:
        base = group.flat.untyped_storage().data_ptr()
        assert all(p.untyped_storage().data_ptr() == base for p in group.params)
        assert all(p.grad is v for p, v in zip(group.params, group.grad_views, strict=True))
    assert [len(g["params"]) for g in flat_opt.param_groups] == [1, 1]
    # the steps above took the direct fused-kernel path where the groups are fused
    assert flat_opt._fused_step() is fused


def test_the_step_is_torchs_own_where_a_profiler_or_a_step_hook_would_see_it() -> None:
    """Unwrapped with nothing watching (torch did not replace the class's step with its profiling
    wrapper); with a step hook or under torch.profiler it takes torch's wrapper, hooks run once a
    step, and the update is the same to the bit as the unwatched step's."""
    (_, _), (watched, watched_opt) = _pair(True)
    (_, _), (alone, alone_opt) = _pair(True)
    assert type(alone_opt).step is FlatAdamW.__dict__["step"]
    calls: list[str] = []
    pre = watched_opt.register_step_pre_hook(lambda *a: calls.append("pre"))
    post = watched_opt.register_step_post_hook(lambda *a: calls.append("post"))
    try:
        for seed in range(2):  # the first falls back to AdamW's step, the second is the fused kernel
            assert _step(watched, watched_opt, seed) == _step(alone, alone_opt, seed)
    finally:
        pre.remove()
        post.remove()
    assert calls == ["pre", "post"] * 2
    hook = register_optimizer_step_post_hook(  # every optimizer's: count this one's
        lambda opt, *a: calls.append("global") if opt is watched_opt else None)
    try:
        _step(watched, watched_opt, 2)
    finally:
        hook.remove()
    _step(alone, alone_opt, 2)
    assert calls[-1] == "global"
    with torch.profiler.profile() as prof:
        _step(watched, watched_opt, 3)
    _step(alone, alone_opt, 3)
    assert "Optimizer.step#FlatAdamW.step" in {e.name for e in prof.events()}
    for (k, x), (_, y) in zip(watched.state_dict().items(), alone.state_dict().items(), strict=True):
        assert torch.equal(x, y), k


@pytest.mark.parametrize("max_norm", [0.05, 1e3])  # clipped, and left alone
def test_clip_grad_norm_over_the_flat_gradient_is_torchs(max_norm: float) -> None:
    (plain, _), (flat, opt) = _pair(fused=True)
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    for model in (plain, flat):
        model(ids).float().pow(2).mean().backward()
    want = torch.nn.utils.clip_grad_norm_(plain.parameters(), max_norm)
    torch.testing.assert_close(opt.clip_grad_norm_(max_norm), want)
    for (k, a), (_, b) in zip(plain.named_parameters(), flat.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-8, msg=k)
    if want > max_norm:
        assert float(torch.linalg.vector_norm(opt.flat_grad)) == pytest.approx(max_norm, rel=1e-4)


def test_state_dict_has_adamws_per_parameter_layout() -> None:
    (plain, plain_opt), (flat, flat_opt) = _pair(fused=True)
    for seed in range(3):
        _step(plain, plain_opt, seed), _step(flat, flat_opt, seed)
    want, got = plain_opt.state_dict(), flat_opt.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"]) == list(range(len(list(plain.parameters()))))
    for i, entry in want["state"].items():
        assert set(got["state"][i]) == set(entry)
        for key, value in entry.items():
            assert got["state"][i][key].shape == value.shape, (i, key)
            torch.testing.assert_close(got["state"][i][key], value, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("direction", ["plain_to_flat", "flat_to_plain"])
def test_a_state_moves_between_adamw_and_flat_adamw(direction: str) -> None:
    (plain, plain_opt), (flat, flat_opt) = _pair(fused=True)
    for seed in range(3):
        _step(plain, plain_opt, seed), _step(flat, flat_opt, seed)
    source_model, source = (plain, plain_opt) if direction == "plain_to_flat" else (flat, flat_opt)
    target = _model()
    target.load_state_dict(source_model.state_dict())
    kind = FlatAdamW if direction == "plain_to_flat" else torch.optim.AdamW
    target_opt = kind(param_groups(target, 0.1)[0], lr=3e-2, betas=(0.9, 0.95), fused=True)
    saved = io.BytesIO()  # through a file, as a checkpoint goes (a live state_dict shares tensors)
    torch.save(source.state_dict(), saved)
    saved.seek(0)
    target_opt.load_state_dict(torch.load(saved, weights_only=True))
    for seed in range(3, 6):  # the target carries on exactly where the source is
        _step(source_model, source, seed), _step(target, target_opt, seed)
    _assert_same_weights(source_model, target)


def test_a_parameter_without_a_state_starts_from_zero_moments() -> None:
    """A per-parameter AdamW keeps no state for a parameter that never had a gradient."""
    model = _model()
    groups = param_groups(model, 0.1)[0]
    opt = torch.optim.AdamW(groups, lr=1e-2)
    skipped = groups[0]["params"][1]
    _step(model, opt, 0)
    state = opt.state_dict()
    del state["state"][1]
    flat = flatten_state(state, FlatAdamW(param_groups(_model(), 0.1)[0], lr=1e-2).flat_groups)
    first = groups[0]["params"][0].numel()
    cut = flat["state"][0]["exp_avg"][first:first + skipped.numel()]
    assert not cut.any() and flat["state"][0]["exp_avg"][:first].any()
    assert flat["param_groups"][0]["params"] == [0] and float(flat["state"][0]["step"]) == 1.0


def test_zero_grad_puts_back_a_replaced_gradient_and_step_refuses_a_late_one() -> None:
    (_, _), (flat, opt) = _pair(fused=True)
    ids = torch.randint(0, V, (2, T))

    def backward() -> None:
        flat(ids).float().pow(2).mean().backward()

    flat.zero_grad(set_to_none=True)  # the module's own zero_grad frees its gradients
    opt.zero_grad()
    backward()
    assert all(g.grad.any() for g in opt.flat_groups)
    opt.step()
    opt.zero_grad()
    flat.zero_grad(set_to_none=True)  # now after the optimizer's: its gradients would be lost
    backward()
    with pytest.raises(RuntimeError, match=r"optim\.flat_params.*set optim\.flat_params=false"):
        opt.step()


def test_mixed_dtypes_are_refused_when_asked_for_and_left_alone_by_default(tmp_path: Path) -> None:
    model = _model()
    groups = param_groups(model, 0.1)[0]
    groups[1]["params"][0].data = groups[1]["params"][0].data.double()
    with pytest.raises(ValueError, match=r"optim\.flat_params.*set optim\.flat_params=false"):
        FlatAdamW(groups, lr=1e-2)
    module = CausalLM(ModelConfig(vocab_size=V, max_seq_len=T, d_model=16, n_layers=1, n_heads=4),
                      OptimConfig(lr=1e-2), total_steps=2)
    module.trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                                enable_checkpointing=False, default_root_dir=tmp_path)
    assert module._flat_params(module.optim_cfg)  # one process, eager: on by default
    weight = next(module.model.parameters())
    weight.data = weight.data.double()
    assert not module._flat_params(module.optim_cfg)  # two dtypes: per-parameter AdamW
    with pytest.raises(ValueError, match=r"optim\.flat_params"):
        build_optimizer(module.model, OptimConfig(lr=1e-2, flat_params=True), flat=True)


def test_a_one_process_run_steps_flat_groups_and_resumes_either_way(tmp_path: Path,
                                                                   shakespeare_char) -> None:
    """By default a one-process Lightning run uses FlatAdamW; a checkpoint it writes resumes
    under a plain AdamW (and the other way round) onto the uninterrupted run's weights."""
    def module(flat_params: bool | None) -> CausalLM:
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=shakespeare_char.vocab_size, max_seq_len=T, d_model=16,
                          n_layers=1, n_heads=4, bias=False)
        return CausalLM(cfg, OptimConfig(lr=1e-2, flat_params=flat_params), total_steps=6)

    def fit(m: CausalLM, steps: int, folder: str, **kw: object):
        data = CausalLMDataModule(shakespeare_char, block_size=T, batch_size=4, seed=0, val_batches=1)
        return _fit(m, steps, tmp_path / folder, data=data, **kw)[0]

    whole = module(None)
    assert isinstance(fit(whole, 6, "whole").optimizers[0], FlatAdamW)
    for first, then in ((None, False), (False, None)):
        part = module(first)
        assert isinstance(fit(part, 4, f"{first}").optimizers[0], FlatAdamW) == (first is None)
        resumed = module(then)
        trainer = fit(resumed, 6, f"{first}", ckpt_path=tmp_path / f"{first}" / "ckpt" / "last.ckpt")
        assert trainer.global_step == 6
        assert isinstance(trainer.optimizers[0], FlatAdamW) == (then is None)
        _assert_same_weights(whole, resumed)
