"""Each objective trains with a real Trainer on CPU, with the real DataModules."""

from __future__ import annotations

import math

import pytest
import torch

from scalelab.data import DataConfig, PreparedData
from scalelab.data.datamodules import CausalLMDataModule, MaskedLMDataModule, Seq2SeqDataModule
from scalelab.model import ModelConfig
from scalelab.training import CausalLM, MaskedLM, OptimConfig, Seq2Seq

from .conftest import cpu_trainer


def _val_loss(trainer, module, dm) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.validate(module, dm, verbose=False)[0].items()}


def test_causal_lm_loss_falls(shakespeare_char: PreparedData) -> None:
    prep = shakespeare_char
    dm = CausalLMDataModule(prep, block_size=32, batch_size=16, seed=0, val_batches=4)
    cfg = ModelConfig(vocab_size=prep.vocab_size, max_seq_len=32, d_model=64, n_layers=2, n_heads=4)
    steps = 100
    module = CausalLM(cfg, OptimConfig(lr=3e-3, warmup_steps=5), total_steps=steps,
                      bytes_per_token=prep.bytes_per_token, tokenizer=prep.tokenizer, sample_tokens=20)
    trainer = cpu_trainer(steps, val_check_interval=steps, limit_val_batches=4)
    before = _val_loss(trainer, module, dm)
    assert before["val/loss"] == pytest.approx(math.log(prep.vocab_size), abs=0.3)
    trainer.fit(module, dm)
    after = module.last_val
    assert after["val/loss"] < before["val/loss"] - 1.0, (before, after)
    assert after["val/ppl"] == pytest.approx(math.exp(after["val/loss"]), rel=1e-6)
    # char-level: bytes_per_token is ~1 (plain ASCII), so bpb ~ loss / ln 2
    assert after["val/bpb"] == pytest.approx(after["val/loss"] / math.log(2) / prep.bytes_per_token)
    # train metrics of the last step
    m = trainer.callback_metrics
    for key in ("train/loss", "train/ppl", "lr", "grad_norm", "tokens_seen"):
        assert key in m, key
    assert float(m["tokens_seen"]) == steps * 16 * 32 == module.tokens_seen
    assert float(m["lr"]) == pytest.approx(3e-4, rel=1e-5)  # min_lr_ratio * lr on the last step
    assert float(m["grad_norm"]) > 0
    assert float(m["train/loss"]) < before["val/loss"] - 1.0
    # a text sample was taken at the validation during fit
    assert isinstance(module.last_sample, str) and module.last_sample.startswith("\n")
    assert len(module.last_sample) > 1 and module.samples[-1] == (steps, module.last_sample)


def test_masked_lm_loss_falls(shakespeare_char: PreparedData) -> None:
    prep = shakespeare_char
    dm = MaskedLMDataModule(prep, block_size=32, batch_size=16, seed=0, val_batches=4)
    cfg = ModelConfig(arch="encoder", vocab_size=prep.vocab_size, max_seq_len=32, d_model=64,
                      n_layers=2, n_heads=4, norm_position="post")
    steps = 100
    module = MaskedLM(cfg, OptimConfig(lr=3e-3, warmup_steps=5), total_steps=steps,
                      tokenizer=prep.tokenizer)
    trainer = cpu_trainer(steps, val_check_interval=steps, limit_val_batches=4)
    before = _val_loss(trainer, module, dm)
    trainer.fit(module, dm)
    after = module.last_val
    assert after["val/loss"] < before["val/loss"] - 0.8, (before, after)
    assert after["val/accuracy"] > before["val/accuracy"] + 0.1
    assert "val/bpb" not in after  # bits per byte is defined for causal LMs only
    assert module.last_sample is None  # encoders do not sample


@pytest.mark.slow
def test_seq2seq_reverse_reaches_high_exact_match() -> None:
    data = DataConfig(name="synthetic_seq2seq", task="reverse", n_train=5000, n_val=64,
                      min_len=1, max_len=5, seed=0)
    dm = Seq2SeqDataModule(data, batch_size=32, seed=0)
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=dm.vocab_size, max_seq_len=8, d_model=64,
                      n_layers=2, n_heads=4)
    steps = 300
    module = Seq2Seq(cfg, OptimConfig(lr=3e-3, warmup_steps=20, weight_decay=0.0),
                     total_steps=steps, tokenizer=dm.tokenizer)
    assert module.eos_token_id == dm.eos_id
    trainer = cpu_trainer(steps, val_check_interval=None, check_val_every_n_epoch=None)
    before = _val_loss(trainer, module, dm)
    assert before["val/exact_match"] < 0.05
    trainer.fit(module, dm)
    after = _val_loss(trainer, module, dm)
    assert after["val/exact_match"] >= 0.9, after
    assert after["val/loss"] < 0.2
    # seq2seq counts target tokens (the ModelConfig FLOPs convention for enc-dec)
    assert module.tokens_seen > 0 and module.tokens_seen % 32 == 0


def test_objective_and_arch_must_match() -> None:
    dec = ModelConfig(vocab_size=20, max_seq_len=8, d_model=16, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match=r"model.arch='decoder' .* needs model.arch='encoder'"):
        MaskedLM(dec, total_steps=10)
    with pytest.raises(ValueError, match="total_steps=0"):
        CausalLM(dec, total_steps=0)
    with pytest.raises(ValueError, match="bytes_per_token"):
        CausalLM(dec, total_steps=5, bytes_per_token=0.0)


def test_val_metrics_are_token_weighted() -> None:
    # Two batches with different numbers of scored tokens: val/loss is the mean over tokens,
    # not the mean of per-batch means.
    cfg = ModelConfig(vocab_size=20, max_seq_len=8, d_model=16, n_layers=1, n_heads=2)
    module = CausalLM(cfg, total_steps=5)
    g = torch.Generator().manual_seed(0)
    b1 = {"input_ids": torch.randint(0, 20, (2, 8), generator=g), "labels": torch.randint(0, 20, (2, 8), generator=g)}
    b2 = {"input_ids": torch.randint(0, 20, (2, 8), generator=g), "labels": torch.full((2, 8), -100)}
    b2["labels"][0, :3] = torch.tensor([1, 2, 3])
    module.eval()
    module.on_validation_epoch_start()
    total, n = 0.0, 0
    with torch.no_grad():
        for b in (b1, b2):
            module.validation_step(b, 0)
            logits = module(b)
            mask = b["labels"] != -100
            total += torch.nn.functional.cross_entropy(logits[mask], b["labels"][mask], reduction="sum").item()
            n += int(mask.sum())
    sums = module.val_sums.reduced(None)
    metrics = module.val_metrics(sums)
    assert sums["tokens"] == n == 19
    assert metrics["val/loss"] == pytest.approx(total / n, rel=1e-5)


def _train_batches(objective: str, prep: PreparedData) -> tuple[object, list[dict[str, torch.Tensor]]]:
    if objective == "seq2seq":
        dm = Seq2SeqDataModule(DataConfig(name="synthetic_seq2seq", task="reverse", n_train=64,
                                          n_val=8, min_len=1, max_len=5, seed=0), batch_size=8, seed=0)
        cfg = ModelConfig(arch="encoder_decoder", vocab_size=dm.vocab_size, max_seq_len=8,
                          d_model=16, n_layers=1, n_heads=2)
        module = Seq2Seq(cfg, total_steps=5, tokenizer=dm.tokenizer)
    else:
        kind = CausalLMDataModule if objective == "causal" else MaskedLMDataModule
        dm = kind(prep, block_size=16, batch_size=4, seed=0, val_batches=1)
        cfg = ModelConfig(arch="decoder" if objective == "causal" else "encoder",
                          vocab_size=prep.vocab_size, max_seq_len=16, d_model=16, n_layers=1, n_heads=2)
        module = (CausalLM if objective == "causal" else MaskedLM)(cfg, total_steps=5)
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    return module, [next(it) for _ in range(3)]


@pytest.mark.parametrize("objective", ["causal", "mlm", "seq2seq"])
def test_the_training_loss_is_the_mean_over_scored_tokens(objective: str,
                                                          shakespeare_char: PreparedData) -> None:
    module, batches = _train_batches(objective, shakespeare_char)
    for b in batches:
        scored = b["labels"] != -100
        # The causal LM takes cross-entropy's own mean on the premise that all its labels count.
        assert module.every_label_scored == bool(scored.all()) == (objective == "causal")
        logits = module(b)
        want = torch.nn.functional.cross_entropy(logits[scored].float(), b["labels"][scored])
        torch.testing.assert_close(module.training_step(b, 0), want, rtol=1e-6, atol=1e-6)
    if objective != "causal":  # a batch with nothing scored trains on a loss of 0, not NaN
        b = {**batches[0], "labels": torch.full_like(batches[0]["labels"], -100)}
        assert float(module.training_step(b, 0).detach()) == 0.0
