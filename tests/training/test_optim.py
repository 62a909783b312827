from __future__ import annotations

import pytest
import torch

from scalelab.model import ModelConfig, Transformer
from scalelab.training import OptimConfig, build_optimizer, param_groups


def tiny(**kw) -> Transformer:
    base = {"vocab_size": 50, "max_seq_len": 16, "d_model": 32, "n_layers": 2, "n_heads": 4}
    return Transformer(ModelConfig(**{**base, **kw}))


def test_groups_gpt_style() -> None:
    model = tiny(position="learned", tie_embeddings=True, bias=True)
    groups, s = param_groups(model, weight_decay=0.1)
    decay = set(s.decay_names)
    no_decay = set(s.no_decay_names)
    names = dict(model.named_parameters())
    assert decay | no_decay == set(names) and not decay & no_decay
    for n, p in names.items():
        is_emb = n.startswith(("tok_emb", "pos"))
        assert (n in decay) == (p.ndim >= 2 and not is_emb), n
    # norms and biases are 1-D and never decayed; the tied embedding is counted once
    assert any("norm" in n or "ln" in n for n in no_decay)
    assert any(n.endswith("bias") for n in no_decay)
    assert "lm_head.weight" not in names  # tied: one tensor
    assert s.decay_params + s.no_decay_params == sum(p.numel() for p in model.parameters())
    assert s.decay_params + s.no_decay_params == model.cfg.n_params()
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0


def test_decay_embeddings_switch_and_untied_head() -> None:
    model = tiny(position="learned", tie_embeddings=False)
    _, s = param_groups(model, 0.1, decay_embeddings=False)
    assert "tok_emb.weight" in s.no_decay_names
    assert "lm_head.weight" in s.decay_names  # an untied output layer is a matmul
    _, s2 = param_groups(model, 0.1, decay_embeddings=True)
    assert "tok_emb.weight" in s2.decay_names
    assert s2.decay_params > s.decay_params


def test_llama_style_no_bias_rmsnorm() -> None:
    model = tiny(norm="rmsnorm", mlp="swiglu", position="rope", bias=False)
    _, s = param_groups(model, 0.1)
    assert not any(n.endswith("bias") for n in s.decay_names + s.no_decay_names)
    assert all(p.ndim == 1 for n, p in model.named_parameters() if n in s.no_decay_names
               and n != "tok_emb.weight")


def test_build_optimizer_fused_on_cpu() -> None:
    model = tiny()
    opt, s = build_optimizer(model, OptimConfig(lr=1e-3, beta2=0.99))
    assert isinstance(opt, torch.optim.AdamW)
    # torch >= 2.4 ships a fused CPU AdamW; auto mode uses it
    assert opt.defaults["fused"] is True
    assert opt.defaults["betas"] == (0.9, 0.99)
    assert [g["name"] for g in opt.param_groups] == ["decay", "no_decay"]
    assert s.decay_tensors == len(opt.param_groups[0]["params"])
    opt2, _ = build_optimizer(model, OptimConfig(fused=False))
    assert not opt2.defaults["fused"]
    # one real step moves the weights
    x = torch.randint(0, 50, (2, 8))
    before = model.tok_emb.weight.detach().clone()
    model(x).sum().backward()
    opt.step()
    assert not torch.equal(before, model.tok_emb.weight)


def test_fused_forced_where_unsupported_is_a_clear_error() -> None:
    with torch.device("meta"):  # no fused kernel for the meta device
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"optim.fused=true .*\['meta'\]"):
        build_optimizer(model, OptimConfig(fused=True))
