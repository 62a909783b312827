"""Activation checkpointing: same loss and gradients, same parameters, less saved memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalelab.model import ModelConfig, Transformer


def _loss_and_grads(model: Transformer, batch: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # dropout draws the same masks on both sides
    logits = model(**{k: v for k, v in batch.items() if k != "labels"})
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


CASES = {
    "gpt": dict(arch="decoder", dropout=0.1),
    "llama": dict(arch="decoder", mlp="swiglu", norm="rmsnorm", position="rope", n_kv_heads=1,
                  bias=False),
    "encoder": dict(arch="encoder", norm_position="post"),
    "encdec": dict(arch="encoder_decoder", position="sinusoidal"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checkpointing_gives_identical_loss_and_grads(case: str) -> None:
    cfg = ModelConfig(vocab_size=50, max_seq_len=16, d_model=32, n_layers=2, n_heads=2, **CASES[case])
    torch.manual_seed(0)
    model = Transformer(cfg).train()
    x = torch.randint(0, 50, (3, 16))
    batch = {"input_ids": x, "labels": torch.roll(x, -1, 1)}
    if case == "encdec":
        batch["src_ids"] = torch.randint(0, 50, (3, 12))
    keys = list(model.state_dict())
    n_params = sum(p.numel() for p in model.parameters())
    plain_loss, plain = _loss_and_grads(model, batch)
    model.set_activation_checkpointing(True)
    ck_loss, ck = _loss_and_grads(model, batch)
    assert ck_loss == pytest.approx(plain_loss, abs=1e-6)
    for name, g in plain.items():
        torch.testing.assert_close(ck[name], g, rtol=1e-5, atol=1e-6, msg=name)
    assert list(model.state_dict()) == keys
    assert sum(p.numel() for p in model.parameters()) == n_params


def saved_activation_bytes(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes autograd keeps for backward during one forward (what checkpointing trades away)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if not isinstance(t, torch.nn.Parameter):
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
    return total, loss


def test_checkpointing_saves_activation_memory() -> None:
    cfg = ModelConfig(vocab_size=64, max_seq_len=64, d_model=64, n_layers=4, n_heads=4)
    model = Transformer(cfg).train()
    x = torch.randint(0, 64, (4, 64))
    plain, _ = saved_activation_bytes(model, x)
    model.set_activation_checkpointing(True)
    checkpointed, _ = saved_activation_bytes(model, x)
    assert checkpointed < 0.5 * plain


def test_generation_ignores_checkpointing() -> None:
    cfg = ModelConfig(vocab_size=50, max_seq_len=32, d_model=32, n_layers=2, n_heads=2)
    model = Transformer(cfg).eval()
    torch.manual_seed(0)
    ref = model.generate(torch.zeros(1, 1, dtype=torch.long), 8, temperature=0.0)
    model.set_activation_checkpointing(True)
    out = model.generate(torch.zeros(1, 1, dtype=torch.long), 8, temperature=0.0)
    assert torch.equal(ref, out)


def test_train_config_key_reaches_the_model() -> None:
    from hydra import compose, initialize_config_dir

    from scalelab.cli.lightning_module import build_module
    from scalelab.config.schema import register
    from scalelab.config.spec import build_spec
    from scalelab.data.bundle import DataBundle
    from scalelab.paths import conf_dir

    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["train.activation_checkpointing=true"])
    spec = build_spec(cfg)
    data = DataBundle(make_datamodule=lambda: None, vocab_size=64, tokenizer=None, tokenizer_spec={},
                      bytes_per_token=1.0)
    module = build_module(spec, spec.with_vocab(64), data)
    assert module.model.decoder.checkpointing and module.hparams["activation_checkpointing"]
