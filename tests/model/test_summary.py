"""The printable summary and `python -m scalelab.model` (nothing allocated)."""

from __future__ import annotations

import json

import pytest

from scalelab.model.__main__ import main
from scalelab.model.presets import preset
from scalelab.model.summary import render_summary, summarize

from .helpers import tiny


def test_cli_gpt2_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "gpt2"]) == 0
    out = capsys.readouterr().out
    assert "124,439,808" in out
    assert "31.65% of N" in out  # embeddings are about 32 % of GPT-2 small


def test_cli_gpt3_shape_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--d-model", "12288", "--n-layers", "96", "--n-heads", "96", "--vocab-size", "50257",
            "--max-seq-len", "2048"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "0.37% of N" in out
    assert "173,946,175,488" in out  # 12 L d^2 ~ 173.9 B


def test_cli_llama_7b_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "llama_7b"]) == 0
    assert "6,738,415,616" in capsys.readouterr().out
    assert main(["--preset", "llama_tiny", "--vocab-size", "65", "--n-kv-heads", "1",
                 "--tie-embeddings", "true", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cfg = preset("llama_tiny", vocab_size=65, n_kv_heads=1, tie_embeddings=True)
    assert data["n_params"] == cfg.n_params()
    assert data["flops_per_token_train"] == cfg.flops_per_token()


def test_cli_bad_value_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--n-heads", "7"]) == 2
    assert "d_model=768 must be divisible by n_heads=7" in capsys.readouterr().err


def test_cli_list_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-presets"]) == 0
    out = capsys.readouterr().out
    assert "gpt2" in out and "124,439,808" in out


def test_summary_per_block_and_totals_consistent() -> None:
    cfg = tiny(arch="encoder_decoder", n_kv_heads=2, mlp="swiglu")
    s = summarize(cfg, seq_len=8)
    assert sum(r["params"] for r in s["rows"]) == s["n_params"]
    assert sum(r["fwd_flops"] for r in s["rows"]) == s["flops_per_token_forward"]
    assert s["flops_per_token_train"] == cfg.flops_per_token(seq_len=8)
    assert set(s["per_block"]) == {"encoder", "decoder"}
    text = render_summary(cfg)
    assert "cross-attention" in text and "one decoder block" in text


def test_summary_of_a_175b_shape_needs_no_allocation() -> None:
    # 175 B float32 parameters would need ~700 GB: finishing at all proves nothing is allocated
    assert "174,604,259,328" in render_summary(preset("gpt3"))
