"""µP (model.parametrization=mup): coordinate check, init, optimizer groups, validation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scalelab.interop.families import NoEquivalentError, family_of
from scalelab.model import ModelConfig, Transformer
from scalelab.training.config import OptimConfig
from scalelab.training.optim import build_optimizer

WIDTHS = (32, 64, 128, 256)
HEAD_DIM = 8  # the sweep family's rule (shape_search): head_dim fixed, n_heads = d / head_dim


def _cfg(parametrization: str, width: int, **kw: object) -> ModelConfig:
    """n_heads fixed: head_dim grows with width."""
    base = WIDTHS[0] if parametrization == "mup" else None
    return ModelConfig(vocab_size=64, max_seq_len=16, d_model=width, n_layers=2, n_heads=4,
                       parametrization=parametrization, mup_base_width=base, **kw)


def _fixed_head_cfg(width: int, base_head_dim: int | None) -> ModelConfig:
    """µP in the sweep family's shapes: head_dim fixed, heads added as width grows."""
    return ModelConfig(vocab_size=64, max_seq_len=16, d_model=width, n_layers=2,
                       n_heads=width // HEAD_DIM, parametrization="mup",
                       mup_base_width=WIDTHS[0], mup_base_head_dim=base_head_dim)


def _attention_logit_scale(attn: torch.nn.Module, rows: torch.Tensor, batch: int) -> float:
    """Mean |q.k * scale| of one self-attention layer, from its qkv_proj output rows."""
    q, k, _ = rows.split(attn.splits, dim=-1)
    q, k = (attn._heads(t, batch, rows.shape[0] // batch, attn.n_heads) for t in (q, k))
    return ((q @ k.transpose(-2, -1)) * attn.scale).abs().mean().item()


def _activation_scales(parametrization: str, width: int, steps: int = 6,
                       cfg: ModelConfig | None = None) -> list[float]:
    """Mean |x| of each block's output, of the output logits and of each layer's attention
    logits after a few Adam steps at one lr (Yang et al.'s coordinate check): it stays flat
    across widths under µP and grows under standard."""
    torch.manual_seed(0)
    cfg = cfg or _cfg(parametrization, width)
    model = Transformer(cfg)
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.0, fused=False),
                             hidden_lr_scale=1.0 / cfg.width_multiplier)
    ids = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    blocks: list[float] = []
    attention: list[float] = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: blocks.append(out.abs().mean().item()))
             for b in model.decoder.blocks]
    for b in model.decoder.blocks:
        attn = b.self_attn.fn
        hooks.append(attn.qkv_proj.register_forward_hook(
            lambda _m, _i, out, attn=attn: attention.append(_attention_logit_scale(attn, out, 4))))
    with torch.no_grad():
        logits = model(ids[:, :-1]).abs().mean().item()
    for h in hooks:
        h.remove()
    return attention + blocks + [logits]  # the first n_layers: attention logits


def _spread(per_width: list[list[float]]) -> float:
    """Largest ratio, over the measured activations, of the widest to the narrowest scale."""
    return max(max(col) / min(col) for col in zip(*per_width, strict=True))


def test_coordinate_check_flat_under_mup_and_growing_under_standard() -> None:
    mup, standard = (_spread([_activation_scales(p, w) for w in WIDTHS])
                     for p in ("mup", "standard"))
    assert mup < 3.0, f"µP activations drift {mup:.1f}x across widths {WIDTHS}"
    assert standard > 5.0 * mup, f"standard {standard:.1f}x vs µP {mup:.1f}x: check has no power"


def test_coordinate_check_in_the_sweep_family_shapes_with_head_dim_fixed() -> None:
    """head_dim 8 at every width, 4 to 32 heads. With the base head_dim set, the attention
    logits (and everything after them) stay O(1); the n_heads-fixed law applied to these shapes
    (base head_dim left to its default, d_base / n_heads) shrinks them by sqrt(m)."""
    fixed, heads_law = (
        [_activation_scales("mup", w, steps=12, cfg=_fixed_head_cfg(w, base)) for w in WIDTHS]
        for base in (HEAD_DIM, None))
    spread = _spread(fixed)
    assert spread < 2.0, f"µP activations drift {spread:.2f}x across widths {WIDTHS}"
    # the attention logits (the first n_layers columns) are what 1/sqrt(m) shrinks
    attn_wrong = _spread([s[:2] for s in heads_law])
    assert attn_wrong > 2.0 * spread, f"{attn_wrong:.2f}x vs {spread:.2f}x: check has no power"


def test_mup_init_divides_hidden_std_by_sqrt_m_and_keeps_embeddings() -> None:
    torch.manual_seed(0)
    cfg = _cfg("mup", 256, init_std=0.02, scale_residual_init=False)
    model = Transformer(cfg)
    m = cfg.width_multiplier
    assert m == 8.0
    attn = model.decoder.blocks[0].self_attn.fn
    assert attn.qkv_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(m), rel=0.05)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.output_mult == pytest.approx(1 / m)
    assert attn.scale == pytest.approx(1 / math.sqrt(cfg.head_dim * m))  # ∝ 1/head_dim
    at_base = Transformer(_cfg("mup", WIDTHS[0])).decoder.blocks[0].self_attn.fn
    assert at_base.scale == pytest.approx(1 / math.sqrt(at_base.head_dim))  # = standard


def test_attention_scale_is_the_head_dim_law_for_both_width_rules() -> None:
    for w in WIDTHS:
        fixed = _fixed_head_cfg(w, HEAD_DIM)  # the per-head dot product does not grow
        assert fixed.attn_score_scale == pytest.approx(1 / math.sqrt(HEAD_DIM))
        heads = _cfg("mup", w)  # head_dim = d / 4 grows with width
        assert heads.attn_score_scale == pytest.approx(
            1 / math.sqrt(heads.head_dim * heads.width_multiplier))
        standard = _cfg("standard", w)
        assert standard.attn_score_scale == 1 / math.sqrt(standard.head_dim)
    wide = Transformer(_fixed_head_cfg(WIDTHS[-1], HEAD_DIM)).decoder.blocks[0].self_attn.fn
    assert wide.scale == pytest.approx(1 / math.sqrt(HEAD_DIM))  # what attention multiplies by
    with pytest.raises(ValueError, match=r"ModelConfig\.mup_base_head_dim=0: must be a positive"):
        _fixed_head_cfg(64, 0)
    with pytest.raises(ValueError, match="mup_base_head_dim=8 is only used with parametrization"):
        ModelConfig(mup_base_head_dim=8)


def test_parametrization_changes_neither_parameter_count_nor_flops() -> None:
    std, mup = _cfg("standard", 128), _cfg("mup", 128)
    assert mup.n_params() == std.n_params() == sum(
        p.numel() for p in Transformer(mup).parameters())
    assert mup.flops_per_token() == std.flops_per_token()


def test_mup_optimizer_gives_hidden_matrices_lr_over_m_and_the_rest_the_base_lr() -> None:
    model = Transformer(_cfg("mup", 128, tie_embeddings=False))
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-3, fused=False), hidden_lr_scale=0.25)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    lrs = {name: lr_of[id(p)] for name, p in model.named_parameters()}
    hidden = {n for n, p in model.named_parameters()
              if p.ndim == 2 and not n.startswith(("tok_emb", "pos", "lm_head"))}
    assert hidden and all(lrs[n] == pytest.approx(2.5e-4) for n in hidden)
    assert all(lr == pytest.approx(1e-3) for n, lr in lrs.items() if n not in hidden)
    assert {"tok_emb.weight", "lm_head.weight"} <= set(lrs) - hidden  # input and output layer
    standard = build_optimizer(model, OptimConfig(lr=1e-3, fused=False))[0]
    assert [g["name"] for g in standard.param_groups] == ["decay", "no_decay"]  # unchanged


def test_logged_lr_is_the_schedule_lr_not_the_hidden_group_lr() -> None:
    model = Transformer(_cfg("mup", 128))
    opt, _ = build_optimizer(model, OptimConfig(lr=1e-3, fused=False), hidden_lr_scale=0.25)
    first = opt.param_groups[0]
    assert first["lr"] / first.get("lr_scale", 1.0) == pytest.approx(1e-3)


def test_mup_needs_a_base_width_and_standard_refuses_one() -> None:
    with pytest.raises(ValueError, match="mup_base_width"):
        ModelConfig(parametrization="mup")
    with pytest.raises(ValueError, match="only used with parametrization=mup"):
        ModelConfig(mup_base_width=128)
    with pytest.raises(ValueError, match="parametrization='mu' is unknown"):
        ModelConfig(parametrization="mu")


def test_mup_model_has_no_hugging_face_equivalent() -> None:
    with pytest.raises(NoEquivalentError, match="parametrization='mup'"):
        family_of(ModelConfig(parametrization="mup", mup_base_width=384))
