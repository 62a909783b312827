from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from scalelab.model import ModelConfig
from scalelab.training import CausalLM, OptimConfig, TextSampler, ThroughputMonitor
from scalelab.training.metrics import total_grad_norm

from .conftest import cpu_trainer

V, T = 32, 16


class CharTok:
    """Enough of the Tokenizer interface for samples: ids are letters a..."""

    def __init__(self, vocab_size: int = V) -> None:
        self.vocab_size = vocab_size

    def encode(self, s: str) -> list[int]:
        return [ord(c) - 97 for c in s]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i) for i in ids)


def loader(n: int, batch_size: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (n, T + 1), generator=g)
    rows = [{"input_ids": r[:-1], "labels": r[1:]} for r in x]
    return DataLoader(rows, batch_size=batch_size)


def tiny_module(steps: int, **kw) -> CausalLM:
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=32, n_layers=2, n_heads=4)
    return CausalLM(cfg, OptimConfig(lr=1e-3, **kw.pop("optim", {})), total_steps=steps, **kw)


def test_throughput_monitor_logs_tokens_and_mfu() -> None:
    steps, bs, accum = 8, 4, 2
    module = tiny_module(steps)
    mon = ThroughputMonitor(every_n_steps=2)
    trainer = cpu_trainer(steps, callbacks=[mon], accumulate_grad_batches=accum,
                          limit_val_batches=0)
    trainer.fit(module, loader(steps * bs * accum, bs))
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert m["tokens_per_sec"] > 0
    assert m["tokens_per_sec_per_device"] == pytest.approx(m["tokens_per_sec"])  # 1 device
    assert m["flops_per_sec"] == pytest.approx(
        m["tokens_per_sec"] * module.model_cfg.flops_per_token(training=True, seq_len=T), rel=1e-6
    )
    assert mon.peak and mon.peak > 0
    # MFU is achieved / peak FLOP/s of the one device, and a real run never reaches the peak
    assert m["mfu"] == pytest.approx(m["flops_per_sec"] / mon.peak, rel=1e-6)
    assert 0 < m["mfu"] < 1.0
    assert set(mon.summary) >= {"tokens_per_sec", "mfu"}
    # tokens_seen counts every micro-batch of the accumulation window
    assert module.tokens_seen == steps * accum * bs * T == m["tokens_seen"]
    assert module.flops_seen == pytest.approx(
        module.tokens_seen * module.model_cfg.flops_per_token(training=True, seq_len=T)
    )


def test_throughput_monitor_uses_given_peak_and_world_size() -> None:
    mon = ThroughputMonitor(peak_flops_per_device=1e9)
    mon.world_size = 4
    out = mon._metrics(tokens=4000, flops=4e9, dt=2.0)
    assert out["tokens_per_sec"] == 2000 and out["tokens_per_sec_per_device"] == 500
    assert out["flops_per_sec_per_device"] == 5e8
    assert out["mfu"] == pytest.approx(2e9 / 4e9)
    with pytest.raises(ValueError, match="every_n_steps=0"):
        ThroughputMonitor(every_n_steps=0)


def test_text_sampler_and_builtin_sample() -> None:
    steps = 4
    module = tiny_module(steps, tokenizer=CharTok(), sample_every_val=False)
    sampler = TextSampler(prompt="abc", max_new_tokens=5, temperature=1.0, top_k=None)
    trainer = cpu_trainer(steps, callbacks=[sampler], val_check_interval=2, limit_val_batches=1)
    trainer.fit(module, loader(steps * 4, 4), loader(4, 4))
    assert module.last_sample is not None and module.last_sample.startswith("abc")
    assert len(module.last_sample) == 8
    assert [s for s, _ in module.samples] == [2, 4]
    # sampling is seeded and does not move the global RNG
    state = torch.get_rng_state()
    a = module.sample("ab", 6)
    assert torch.equal(state, torch.get_rng_state())
    assert a == module.sample("ab", 6) and len(a) == 8
    # a padded vocabulary (model rows past the tokenizer's ids) never reaches decode()
    padded = CausalLM(ModelConfig(vocab_size=64, max_seq_len=T, d_model=32, n_layers=2, n_heads=4),
                      tokenizer=CharTok(vocab_size=26))
    padded.model.lm_head.register_forward_hook(lambda m, i, out: out + torch.arange(64).ge(26) * 100.0)
    assert all("a" <= c <= "z" for c in padded.sample("ab", 20, temperature=1.0))


def test_grad_clip_from_optim_config_and_grad_norm_logged() -> None:
    steps = 3
    module = tiny_module(steps, optim={"grad_clip": 1e-3})
    seen: list[float] = []

    class Probe(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            # grads are kept until the next zero_grad: these are the clipped ones
            seen.append(float(total_grad_norm(pl_module.parameters())))

    trainer = cpu_trainer(steps, callbacks=[Probe()], limit_val_batches=0)
    trainer.fit(module, loader(steps * 4, 4))
    assert all(n <= 1e-3 * 1.001 for n in seen), seen
    assert float(trainer.callback_metrics["grad_norm"]) > 1e-2  # logged before clipping


def test_bf16_mixed_on_cpu_trains() -> None:
    steps = 2
    module = tiny_module(steps)
    trainer = cpu_trainer(steps, precision="bf16-mixed", limit_val_batches=0)
    trainer.fit(module, loader(steps * 4, 4))
    m = trainer.callback_metrics
    assert torch.isfinite(m["train/loss"]) and float(m["grad_norm"]) > 0


@pytest.mark.slow
def test_compile_switch_keeps_checkpoint_keys() -> None:
    steps = 3
    module = tiny_module(steps, compile=True)
    trainer = cpu_trainer(steps, limit_val_batches=1)
    trainer.fit(module, loader(steps * 4, 4), loader(4, 4))
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert all(k.startswith("model.") and "_orig_mod" not in k for k in module.state_dict())
    assert "val/loss" in trainer.callback_metrics
    # training ran forward + cross-entropy as one compiled graph; it computes the eager loss
    assert module.compiled_loss.compiled is not None
    batch = next(iter(loader(4, 4)))
    eager_sum, eager_n = module.token_loss_sum(module.model(batch["input_ids"]), batch["labels"])
    assert int(eager_n) > 0
    torch.testing.assert_close(module.compiled_loss(batch), eager_sum / eager_n, rtol=1e-5, atol=1e-6)
    # validation runs eager: compiling its no-grad graph costs more than it saves
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    trainer.validate(module, loader(4, 4), verbose=False)
    assert counters["stats"]["unique_graphs"] == graphs


def test_fp16_loss_scaling_with_clipping_uses_foreach() -> None:
    # A real GradScaler (on CPU here; the same plugin as precision="16-mixed" on GPU): a fused
    # AdamW would unscale inside step(), after clipping, so the module falls back to foreach.
    from pytorch_lightning.plugins.precision import MixedPrecision

    steps = 2
    module = tiny_module(steps)
    plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    trainer = cpu_trainer(steps, plugins=[plugin], limit_val_batches=0)
    trainer.fit(module, loader(steps * 4, 4))
    assert not trainer.optimizers[0].defaults["fused"]
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    forced = tiny_module(steps, optim={"fused": True})
    with pytest.raises(ValueError, match=r"optim\.fused=true cannot be combined with gradient clipping"):
        cpu_trainer(steps, plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))],
                    limit_val_batches=0).fit(forced, loader(steps * 4, 4))


def test_bad_sample_prompt_fails_at_fit_start() -> None:
    module = tiny_module(2, tokenizer=CharTok(), sample_prompt="\n")  # "\n" is not in CharTok
    trainer = cpu_trainer(2, limit_val_batches=0)
    with pytest.raises(ValueError, match=r"sample_prompt='\\n' encodes to ids \[-87\] outside"):
        trainer.fit(module, loader(8, 4))


def test_peak_is_measured_after_the_first_step_not_before_it() -> None:
    """The MFU peak (~0.3 s of matmuls) stays off the path to the first step: nothing is
    measured when fit starts; the peak exists once the first step is done, before any window."""
    seen: dict[str, object] = {}

    class Watch(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            seen["at_start"] = mon.peak

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            seen.setdefault("after_first", (mon.peak, "time_to_first_step" in mon.summary))

    mon = ThroughputMonitor(every_n_steps=2)
    trainer = cpu_trainer(3, callbacks=[mon, Watch()], limit_val_batches=0)
    trainer.fit(tiny_module(3), loader(12, 4))
    assert seen["at_start"] is None
    peak, ttfs_recorded = seen["after_first"]  # type: ignore[misc]
    assert peak is not None and peak > 0 and ttfs_recorded


def test_compile_blocks_once_marks_the_block_regions_only_when_compiling() -> None:
    assert tiny_module(1, compile=True, compile_blocks_once=True).model.decoder.block_regions
    assert not tiny_module(1, compile=False, compile_blocks_once=True).model.decoder.block_regions
    assert not tiny_module(1, compile=True).model.decoder.block_regions
    assert tiny_module(1, compile=True, compile_blocks_once=True).hparams["compile_blocks_once"]
