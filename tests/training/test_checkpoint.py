"""Checkpoints: plain content (weights_only=True), tokens_seen and the schedule resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from scalelab.data.datamodules import CausalLMDataModule
from scalelab.model import ModelConfig
from scalelab.training import CausalLM, MaskedLM, OptimConfig
from scalelab.training.checkpoint import (
    STATE_KEY,
    CheckpointError,
    load_model,
    model_config,
    read_meta,
    restore_rng_state,
    run_meta,
)

from .conftest import cpu_trainer
from .test_callbacks import CharTok, T, loader, tiny_module


def _fit(module, steps: int, tmp_path: Path, ckpt_path=None, accum: int = 2, data=None):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=2,
                           save_top_k=-1, filename="step{step}")
    trainer = cpu_trainer(steps, tmp_path, callbacks=[ckpt], enable_checkpointing=True,
                          accumulate_grad_batches=accum, limit_val_batches=0)
    trainer.fit(module, data if data is not None else loader(64 * accum * 4, 4), ckpt_path=ckpt_path)
    return trainer, ckpt


def test_checkpoint_loads_with_weights_only(tmp_path: Path) -> None:
    module = tiny_module(4, bytes_per_token=1.5, tokenizer=CharTok(), sample_prompt="a")
    _fit(module, 4, tmp_path)
    path = tmp_path / "ckpt" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    hp = ckpt["hyper_parameters"]
    assert hp["model_cfg"] == module.model_cfg.to_dict()
    assert hp["optim_cfg"]["lr"] == 1e-3 and hp["total_steps"] == 4 and hp["bytes_per_token"] == 1.5
    assert "tokenizer" not in hp
    assert ckpt[STATE_KEY] == {
        "objective": "causal",
        "tokens_seen": 4 * 2 * 4 * T,
        "flops_seen": pytest.approx(module.flops_seen),
    }
    assert model_config(ckpt) == module.model_cfg.to_dict()  # stored once, in hyper_parameters
    # state_dict keys are the plain model's (no compile prefix)
    assert all(k.startswith("model.") and "_orig_mod" not in k for k in ckpt["state_dict"])

    again = CausalLM.load_from_checkpoint(path, weights_only=True, tokenizer=CharTok())
    assert isinstance(again, CausalLM) and again.tokens_seen == module.tokens_seen
    for (k, a), (_, b) in zip(module.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert again.sample("ab", 3).startswith("ab")
    # Lightning's own loader works too (hyperparameters are plain dicts)
    lm = CausalLM.load_from_checkpoint(path, weights_only=True)
    assert lm.model_cfg == module.model_cfg and lm.optim_cfg == module.optim_cfg


def test_resume_continues_tokens_and_schedule(tmp_path: Path, shakespeare_char) -> None:
    steps = 6

    def module() -> CausalLM:
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=shakespeare_char.vocab_size, max_seq_len=T, d_model=32,
                          n_layers=2, n_heads=4)
        return CausalLM(cfg, OptimConfig(lr=1e-3), total_steps=steps)

    def data() -> CausalLMDataModule:  # the real DataModule: its position resumes too
        return CausalLMDataModule(shakespeare_char, block_size=T, batch_size=4, seed=0, val_batches=1)

    first = module()
    _fit(first, steps, tmp_path / "a", data=data())  # the uninterrupted run
    ref_lr = first.trainer.optimizers[0].param_groups[0]["lr"]

    part = module()
    _fit(part, 4, tmp_path / "b", data=data())  # stop after 4 of 6 steps...
    assert part.tokens_seen == 4 * 2 * 4 * T
    resumed = module()
    trainer, _ = _fit(resumed, steps, tmp_path / "b", data=data(),
                      ckpt_path=tmp_path / "b" / "ckpt" / "last.ckpt")
    assert trainer.global_step == steps
    assert resumed.tokens_seen == first.tokens_seen == steps * 2 * 4 * T  # ...and carry on counting
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(ref_lr)
    # same data position, optimizer and schedule: the weights match the uninterrupted run
    for (k, a), (_, b) in zip(first.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), k


def test_load_model_rejects_foreign_files(tmp_path: Path) -> None:
    p = tmp_path / "x.ckpt"
    torch.save({"state_dict": {}}, p)
    with pytest.raises(CheckpointError, match="no model config"):
        load_model(p)
    assert MaskedLM.objective == "mlm"


OLD_FORMAT = Path(__file__).parent / "data" / "old_format.ckpt"


def test_checkpoint_in_the_old_format_still_loads(tmp_path: Path) -> None:
    """``data/old_format.ckpt`` was written by an earlier scalelab-train, before the checkpoint module
    owned the keys (a 1-layer CausalLM fitted 2 steps with cli.callbacks.RunState): the model
    config stored three times (hyper_parameters, "scalelab", "scalelab_run")."""
    ckpt = torch.load(OLD_FORMAT, map_location="cpu", weights_only=True)
    assert ckpt[STATE_KEY]["model_cfg"] == ckpt["scalelab_run"]["model_config"]  # the old copies
    cfg = model_config(ckpt)
    assert cfg is not None and cfg["d_model"] == 8 and cfg["vocab_size"] == 16
    meta = read_meta(OLD_FORMAT)
    assert meta["model_config"] == cfg and meta["objective"] == "causal" and meta["global_step"] == 2
    assert run_meta(ckpt)["tokenizer"]["name"] == "byte"
    # its attention saved q, k and v apart; the model now keeps one qkv_proj: one line, no traceback
    with pytest.raises(CheckpointError, match="do not fit its model config"):
        load_model(OLD_FORMAT)
    restore_rng_state(ckpt)  # the old RNG entry restores
    assert torch.equal(torch.get_rng_state(), ckpt["scalelab_rng"]["torch"])
