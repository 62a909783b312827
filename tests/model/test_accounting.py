"""Exact accounting: the config's parameter formula equals numel() of the built model."""

from __future__ import annotations

import itertools

import pytest
import torch

from scalelab.model import ModelConfig, Transformer
from scalelab.model.presets import preset
from scalelab.model.variants import ARCHS, MLPS, NORM_POSITIONS, NORMS, POSITIONS

from .helpers import tiny


def numel(cfg: ModelConfig) -> int:
    return sum(p.numel() for p in Transformer(cfg).parameters())  # parameters() dedups tied


def _grid_cfg(arch, norm, norm_position, mlp, position, bias, tie, kv, final_norm) -> ModelConfig:
    return tiny(arch=arch, norm=norm, norm_position=norm_position, mlp=mlp, position=position,
                bias=bias, tie_embeddings=tie, n_kv_heads=kv, final_norm=final_norm,
                d_model=16, n_heads=4, n_layers=1, vocab_size=11, max_seq_len=8,
                n_decoder_layers=2 if arch == "encoder_decoder" else None)


# every registered variant, read from the tables: a new one is covered without editing this file
ARCH, NORM, NORM_POS, MLP, POS = (list(t) for t in (ARCHS, NORMS, NORM_POSITIONS, MLPS, POSITIONS))
BOOL = [True, False]
KV = [None, 2, 1]
FINAL = [None, True, False]


def test_formula_equals_numel_on_count_relevant_grid() -> None:
    """Every combination of the options that change the count (arch x norm x bias x mlp x
    tie x position), with the others cycled through; the full grid is the slow test."""
    for i, (arch, norm, bias, mlp, tie, pos) in enumerate(
            itertools.product(ARCH, NORM, BOOL, MLP, BOOL, POS)):
        cfg = _grid_cfg(arch, norm, NORM_POS[i % len(NORM_POS)], mlp, pos, bias, tie, KV[i % 3],
                        FINAL[i % 3])
        assert cfg.n_params() == numel(cfg), cfg


@pytest.mark.slow
def test_formula_equals_numel_on_full_grid() -> None:
    """All combinations (1,920 with 4 MLPs) of arch, norm, norm_position, mlp, position, bias,
    tying and MHA/MQA; final_norm cycles through None/True/False (~40 s on 2 cores)."""
    grid = itertools.product(ARCH, NORM, NORM_POS, MLP, POS, BOOL, BOOL, [None, 1])
    for i, combo in enumerate(grid):
        cfg = _grid_cfg(*combo, FINAL[i % 3])
        assert cfg.n_params() == numel(cfg), cfg


def test_breakdown_rows_match_module_groups() -> None:
    cfg = tiny(arch="encoder_decoder", mlp="swiglu", n_kv_heads=2, tie_embeddings=False)
    model = Transformer(cfg)
    rows = {c.name: c for c in cfg.breakdown()}
    block = model.decoder.blocks[0]
    assert rows["decoder block: self-attention"].params == sum(
        p.numel() for p in block.self_attn.fn.parameters())
    assert rows["decoder block: cross-attention"].params == sum(
        p.numel() for p in block.cross_attn.fn.parameters())
    assert rows["decoder block: mlp (swiglu)"].params == sum(
        p.numel() for p in block.mlp.fn.parameters())
    assert rows["encoder block: mlp (swiglu)"].count == cfg.encoder_layers
    assert rows["output layer"].params == model.lm_head.weight.numel()


def test_gpt2_small_is_124_439_808() -> None:
    cfg = preset("gpt2")
    v, n_ctx, d, n_layers = 50257, 1024, 768, 12
    closed_form = v * d + n_ctx * d + n_layers * (12 * d * d + 13 * d) + 2 * d
    assert cfg.n_params() == closed_form == 124_439_808
    with torch.device("meta"):  # real modules, shapes only: no 0.5 GB allocation
        assert numel(cfg) == 124_439_808
    share = (v * d + n_ctx * d) / cfg.n_params()
    assert 0.31 < share < 0.33  # embeddings are about 32 % of N
    assert cfg.n_params(non_embedding=True) == 124_439_808 - v * d - n_ctx * d


def test_llama_7b_shape() -> None:
    cfg = preset("llama_7b")
    assert cfg.n_params() == 6_738_415_616
    with torch.device("meta"):
        assert numel(cfg) == 6_738_415_616


def test_gpt3_shape_is_counted_without_allocation() -> None:
    cfg = ModelConfig(d_model=12288, n_layers=96, n_heads=96, vocab_size=50257, max_seq_len=2048)
    n = cfg.n_params()
    emb = 50257 * 12288 + 2048 * 12288
    assert emb / n < 0.004
    assert 12 * 96 * 12288**2 == 173_946_175_488  # ~173.9 B dominates
    assert abs(cfg.n_params(non_embedding=True) - 12 * 96 * 12288**2) / n < 1e-4


@pytest.mark.parametrize("tie", [True, False])
def test_matmul_params_count_output_layer_once(tie: bool) -> None:
    cfg = tiny(tie_embeddings=tie, position="rope")
    assert cfg.n_params_matmul() == cfg.n_params(non_embedding=True) + 37 * 32
    assert cfg.n_params() == cfg.n_params(non_embedding=True) + 37 * 32 * (1 if tie else 2)


def test_flops_per_token_palm_convention() -> None:
    cfg = preset("gpt2")
    n, n_layers, t, d = cfg.n_params_matmul(), 12, 1024, 768
    assert cfg.flops_per_token() == 6 * n + 12 * n_layers * t * d
    assert cfg.flops_per_token(training=False) == 2 * n + 4 * n_layers * t * d
    assert cfg.flops_per_token(attention=False) == 6 * n
    assert cfg.flops_per_token(seq_len=256) == 6 * n + 12 * n_layers * 256 * d
    # the summary's per-component forward FLOPs add up to the same total
    assert sum(c.total_fwd_flops for c in cfg.breakdown()) == cfg.flops_per_token(training=False)


def test_encoder_decoder_flops_count_both_stacks_and_cross_attention() -> None:
    cfg = tiny(arch="encoder_decoder", n_encoder_layers=3, n_decoder_layers=2)
    t, d = 16, 32
    attn = 4 * (3 * t * d + 2 * t * d + 2 * t * d)  # enc self + dec self + cross, S = T
    assert cfg.flops_per_token(training=False) == 2 * cfg.n_params_matmul() + attn
    assert sum(c.total_fwd_flops for c in cfg.breakdown()) == cfg.flops_per_token(training=False)
