"""ModelConfig: derived defaults, validation messages, (de)serialization, variant registries."""

from __future__ import annotations

import pytest

from scalelab.model import ModelConfig
from scalelab.model.blocks import RESIDUAL_CLASSES
from scalelab.model.mlp import MLP_CLASSES
from scalelab.model.norms import NORM_CLASSES
from scalelab.model.positions import POSITION_CLASSES
from scalelab.model.presets import PRESETS, preset, preset_dict
from scalelab.model.variants import (
    ARCHS,
    MLPS,
    NORM_POSITIONS,
    NORMS,
    OBJECTIVE_OF_ARCH,
    POSITIONS,
    check_registry,
)

from .helpers import tiny


def test_defaults_are_gpt2_small() -> None:
    cfg = ModelConfig()
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.vocab_size) == (768, 12, 12, 50257)
    assert cfg.d_ff == 4 * 768 and cfg.n_kv_heads == 12 and cfg.final_norm is True
    assert cfg.head_dim == 64


def test_swiglu_hidden_size_rule() -> None:
    # int(8*128/3) = 341 -> rounded up to a multiple of 32 -> 352
    assert tiny(d_model=128, mlp="swiglu").d_ff == 352
    # Llama-7B: 8*4096/3 = 10922 -> multiple of 256 -> 11008
    assert tiny(d_model=4096, n_heads=32, mlp="swiglu", ffn_multiple_of=256).d_ff == 11008
    assert tiny(mlp="swiglu", d_ff=100).d_ff == 100  # explicit wins


def test_final_norm_default_follows_norm_position() -> None:
    assert tiny(norm_position="pre").final_norm is True
    assert tiny(norm_position="post").final_norm is False
    assert tiny(norm_position="post", final_norm=True).final_norm is True


def test_layer_counts_per_arch() -> None:
    assert (tiny().encoder_layers, tiny().decoder_layers) == (0, 2)
    assert (tiny(arch="encoder").encoder_layers, tiny(arch="encoder").decoder_layers) == (2, 0)
    ed = tiny(arch="encoder_decoder", n_encoder_layers=3)
    assert (ed.encoder_layers, ed.decoder_layers, ed.n_layers_total) == (3, 2, 5)


BAD = [
    (dict(d_model=30, n_heads=4), ["d_model=30", "n_heads=4", "divisible"]),
    (dict(n_kv_heads=3), ["n_heads=4", "n_kv_heads=3", "divisible"]),
    (dict(d_model=12, n_heads=4, position="rope"), ["rope", "head_dim=3", "even"]),
    (dict(d_model=5, n_heads=1, position="sinusoidal"), ["sinusoidal", "d_model", "even"]),
    (dict(arch="gpt"), ["arch='gpt'", "decoder", "encoder_decoder"]),
    (dict(norm="batchnorm"), ["norm='batchnorm'", "layernorm", "rmsnorm"]),
    (dict(norm_position="sandwich"), ["norm_position='sandwich'", "pre", "post"]),
    (dict(mlp="moe"), ["mlp='moe'", "swiglu"]),
    (dict(position="xpos"), ["position='xpos'", "alibi"]),
    (dict(d_model=0), ["d_model=0", "positive"]),
    (dict(n_layers=-1), ["n_layers=-1", "positive"]),
    (dict(n_heads=2.0), ["n_heads=2.0", "positive integer"]),
    (dict(vocab_size=None), ["vocab_size=None", "tokenizer"]),
    (dict(max_seq_len=0), ["max_seq_len=0"]),
    (dict(n_kv_heads=0), ["n_kv_heads=0"]),
    (dict(d_ff=-4), ["d_ff=-4"]),
    (dict(dropout=1.0), ["dropout=1.0", "[0, 1)"]),
    (dict(dropout=-0.1), ["dropout=-0.1", "[0, 1)"]),
    (dict(norm_eps=0.0), ["norm_eps=0.0", "positive"]),
    (dict(bias="yes"), ["bias='yes'", "true or false"]),
    (dict(n_encoder_layers=2), ["n_encoder_layers=2", "encoder_decoder"]),
]


@pytest.mark.parametrize(("kwargs", "fragments"), BAD, ids=[str(k) for k, _ in BAD])
def test_bad_config_names_field_value_and_rule(kwargs: dict, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        tiny(**kwargs)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


def test_dict_round_trip_and_unknown_key() -> None:
    cfg = tiny(arch="encoder_decoder", mlp="swiglu", n_kv_heads=2)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"unknown key.*'d_modle'"):
        ModelConfig.from_dict({**cfg.to_dict(), "d_modle": 3})


def test_replace_re_derives_defaults() -> None:
    cfg = tiny(mlp="swiglu")
    assert cfg.replace(d_model=64).d_ff == 32 * -(-int(8 * 64 / 3) // 32)
    assert cfg.replace(mlp="gelu").d_ff == 4 * 32
    assert tiny(d_ff=50).replace(d_model=64).d_ff == 50  # explicit values are kept
    assert cfg.replace(norm_position="post").final_norm is False
    with pytest.raises(ValueError, match="n_heads=5"):
        cfg.replace(n_heads=5)


def test_registries_match_variant_tables() -> None:
    assert set(NORM_CLASSES) == set(NORMS)
    assert set(MLP_CLASSES) == set(MLPS)
    assert set(POSITION_CLASSES) == set(POSITIONS)
    assert set(RESIDUAL_CLASSES) == set(NORM_POSITIONS) == {"pre", "post"}
    assert set(ARCHS) == {"decoder", "encoder", "encoder_decoder"}
    assert OBJECTIVE_OF_ARCH == {"decoder": "causal", "encoder": "mlm", "encoder_decoder": "seq2seq"}


def test_a_class_without_a_row_fails_loudly() -> None:
    with pytest.raises(TypeError, match=r"ModelConfig.mlp.*'moe'.*variants.py"):
        check_registry("mlp", {**MLP_CLASSES, "moe": object}, MLPS)
    with pytest.raises(TypeError, match="norm"):
        check_registry("norm", {"layernorm": object}, NORMS)


def test_every_preset_builds() -> None:
    for name in PRESETS:
        cfg = preset(name, vocab_size=preset_dict(name)["vocab_size"] or 100)
        assert cfg.n_params() > 0


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'"):
        preset("gpt5")
