"""q, k and v train as one ``qkv_proj`` but save and load as ``q_proj``, ``k_proj``, ``v_proj``."""

from __future__ import annotations

import pytest
import torch

from scalelab.model import Transformer
from scalelab.model.attention import SelfAttention
from scalelab.model.fused_layout import fused_splits, keep_fused

from .helpers import tiny


def test_state_dict_holds_the_parts_in_the_unfused_order_and_values() -> None:
    attn = SelfAttention(tiny(n_kv_heads=2))  # q 32 rows, k and v 16 each
    sd = attn.state_dict()
    assert list(sd) == [f"{p}_proj.{s}" for p in "qkvo" for s in ("weight", "bias")]
    w, b = attn.qkv_proj.weight.detach(), attn.qkv_proj.bias.detach()
    torch.testing.assert_close(torch.cat([sd["q_proj.weight"], sd["k_proj.weight"], sd["v_proj.weight"]]), w)
    torch.testing.assert_close(torch.cat([sd["q_proj.bias"], sd["k_proj.bias"], sd["v_proj.bias"]]), b)
    assert sd["k_proj.weight"].shape == (16, 32) and not sd["k_proj.weight"].requires_grad


def test_parts_load_into_the_fused_parameter_exactly() -> None:
    src, dst = Transformer(tiny(n_kv_heads=1)), Transformer(tiny(n_kv_heads=1))
    assert dst.load_state_dict(src.state_dict()) is not None
    for (name, a), (_, b) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    ids = torch.randint(0, 37, (2, 9))
    torch.testing.assert_close(dst(ids), src(ids))


def test_keep_fused_saves_qkv_proj_and_either_layout_loads() -> None:
    src = Transformer(tiny())
    keep_fused(src)  # as under FSDP1
    fused = src.state_dict()
    assert "decoder.blocks.0.self_attn.fn.qkv_proj.weight" in fused
    assert not any("q_proj" in k for k in fused)
    dst = Transformer(tiny())
    dst.load_state_dict(fused)
    assert torch.equal(dst.decoder.blocks[0].self_attn.fn.qkv_proj.weight,
                       src.decoder.blocks[0].self_attn.fn.qkv_proj.weight)


def test_a_wrong_part_shape_is_named_as_torch_names_it() -> None:
    gqa, mha = SelfAttention(tiny(n_kv_heads=2)), SelfAttention(tiny())
    with pytest.raises(RuntimeError, match=r"size mismatch for k_proj\.weight: copying a param with "
                       r"shape torch\.Size\(\[16, 32\]\).*current model is torch\.Size\(\[32, 32\]\)"):
        mha.load_state_dict(gqa.state_dict())


def test_fused_splits_lists_every_self_attention_projection() -> None:
    model = Transformer(tiny(arch="encoder_decoder", n_kv_heads=2))
    splits = fused_splits(model)
    n_self = sum(isinstance(m, SelfAttention) for m in model.modules())
    assert n_self == 4 and len(splits) == 2 * n_self  # weight and bias of each
    assert set(splits.values()) == {(32, 16, 16)}
