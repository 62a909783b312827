"""scalelab-eval figures, scalelab-viz pictures, and per-validation sample artifacts."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.conftest import sqlite_store

from scalelab.model import ModelConfig, Transformer
from scalelab.model.attention import SelfAttention
from scalelab.model.positions import sinusoidal_table
from scalelab.training.evaluate import evaluate_causal
from scalelab.viz.attention_maps import attention_weights
from scalelab.viz.positions import plot_positions, rope_relative_scores


def test_uniform_model_scores_exactly_log_vocab() -> None:
    """Zero weights -> uniform logits: loss = ln V, perplexity = V, bpb = log2 V / bytes per token."""
    cfg = ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_seq_len=16)
    model = Transformer(cfg)
    with torch.no_grad():
        model.tok_emb.weight.zero_()
    tokens = np.arange(1000) % 50
    res = evaluate_causal(model.eval(), tokens, n_tokens=160, block_size=16, bytes_per_token=2.0)
    assert (res.n_tokens, res.n_windows) == (160, 10)
    assert res.loss == pytest.approx(math.log(50), abs=1e-5)
    assert res.perplexity == pytest.approx(50, rel=1e-4)
    assert res.bits_per_byte == pytest.approx(math.log2(50) / 2, rel=1e-5)
    assert res.loss_se == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("kw", [
    dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_heads=1, bias=False),  # MQA, causal
    dict(arch="encoder", norm_position="post", position="alibi"),  # bidirectional + bias mask
])
def test_attention_weights_reproduce_the_sdpa_output(kw: dict) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, **kw)
    model = Transformer(cfg).eval()
    ids = torch.randint(0, 40, (1, 12))
    outs: list[tuple[SelfAttention, torch.Tensor]] = []
    hooks = [m.register_forward_hook(lambda m, a, k, o: outs.append((m, o)), with_kwargs=True)
             for m in model.modules() if isinstance(m, SelfAttention)]
    ins: list[tuple[torch.Tensor, object]] = []
    hooks += [m.register_forward_pre_hook(lambda m, a: ins.append((a[0], a[1])))
              for m in model.modules() if isinstance(m, SelfAttention)]
    model(ids)
    for h in hooks:
        h.remove()
    w = attention_weights(model, ids)
    assert w.shape == (2, 4, 12, 12)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 12), atol=1e-5)
    if cfg.arch == "decoder":
        assert float(w.triu(1).abs().max()) == 0.0
    for layer, ((attn, out), (x, ctx)) in enumerate(zip(outs, ins, strict=True)):
        v = attn.heads(x, ctx)[2].repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
        y = (w[layer][None] @ v).transpose(1, 2).reshape(12, cfg.d_model)  # rows, as the model's
        assert torch.allclose(attn.o_proj(y), out, atol=1e-5), layer


def test_position_similarities_depend_only_on_the_offset(tmp_path: Path) -> None:
    pe = sinusoidal_table(torch.arange(40), 64)
    for sim in (pe @ pe.T, rope_relative_scores(40, 32)):
        for k in range(-5, 6):
            diag = torch.diagonal(sim, k)
            assert float(diag.max() - diag.min()) < 1e-4, k
    learned = torch.randn(40, 64)
    path = plot_positions(tmp_path / "pos.png", n_pos=40, d_model=64, learned=learned)
    assert path.stat().st_size > 10_000


@pytest.mark.slow
def test_eval_and_viz_log_back_to_the_run(tmp_path: Path, train_cli, shared_data_dir: Path) -> None:
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    r = train_cli.run(*train_cli.isolated(tmp_path), "model=gpt2_tiny", "data=shakespeare",
                      f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", "tokenizer=char",
                      "train.max_steps=4", "train.val_every=2", "train.val_batches=1",
                      "train.global_batch_size=4", "train.block_size=32",
                      "callbacks.sample.max_new_tokens=20", f"paths.output_dir={out}", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run_id = (out / "mlflow_run_id").read_text().strip()
    uri = sqlite_store(tmp_path / "mlruns.db")
    client = MlflowClient(uri)
    samples = sorted(a.path for a in client.list_artifacts(run_id, "samples"))
    assert samples == ["samples/step_000002.txt", "samples/step_000004.txt"]
    assert (out / "samples" / "step_000004.txt").read_text()

    def cli(mod: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", mod, *args], capture_output=True, text=True,
                              timeout=600)

    r = cli("scalelab.cli.eval", run_id, "--tracking-uri", uri, "--tokens", "2048",
            "--block-size", "32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2,048 tokens" in r.stdout
    r = cli("scalelab.cli.eval", run_id, "--tracking-uri", uri, "--tokens", "1024",
            "--block-size", "16")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = client.get_run(run_id).data.metrics
    key = "eval/shakespeare/val/tok2048_ctx32"  # the settings are part of the key
    loss = metrics[f"{key}/loss"]
    assert 0 < loss < math.log(70) + 1 and metrics[f"{key}/loss_se"] > 0
    assert metrics[f"{key}/bits_per_byte"] > 0
    other = "eval/shakespeare/val/tok1024_ctx16"  # a second eval with other settings: kept apart
    assert metrics[f"{other}/n_tokens"] == 1024 and metrics[f"{key}/n_tokens"] == 2048
    assert [m.step for m in client.get_metric_history(run_id, f"{key}/loss")] == [4]

    r = cli("scalelab.cli.viz", "attention", run_id, "--tracking-uri", uri, "--prompt", "ROMEO:",
            "--out", str(tmp_path / "attn.png"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [a.path for a in client.list_artifacts(run_id, "viz")] == ["viz/attn.png"]

    r = cli("scalelab.cli.eval", str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr


def test_ratio_estimator_reduces_to_the_plain_mean_for_equal_rows() -> None:
    from scalelab.training.evaluate import _ratio

    sums = torch.tensor([3.0, 5.0, 4.0, 8.0])
    mean, se = _ratio(sums, torch.full((4,), 2.0))
    assert mean == pytest.approx(20 / 8)
    assert se == pytest.approx(float((sums / 2).std() / 2))  # std of row means / sqrt(4)
    mean, _ = _ratio(torch.tensor([1.0, 9.0]), torch.tensor([1.0, 3.0]))
    assert mean == pytest.approx(10 / 4)  # token-weighted, not (1 + 3) / 2


def test_a_rope_runs_position_picture_shows_its_own_geometry(tmp_path: Path) -> None:
    """The first layer's q.k with one token at every position depends on p - q only (RoPE), and
    on the weights: two models give two pictures, unlike the run-less analytic panel."""
    from scalelab.viz.attention_maps import first_layer_position_scores, plot_attention_grid

    pictures, scores = [], []
    for seed in (0, 1):
        torch.manual_seed(seed)
        cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=1, n_heads=4, max_seq_len=24,
                          position="rope", norm="rmsnorm", mlp="swiglu", bias=False)
        s = first_layer_position_scores(Transformer(cfg).eval(), 24, token=3)
        for k in range(-5, 6):
            diag = torch.diagonal(s, k)
            assert float(diag.max() - diag.min()) < 1e-4, k
        scores.append(s)
        pictures.append(plot_positions(tmp_path / f"pos{seed}.png", n_pos=24, d_model=32,
                                       head_dim=8, run_scores=s, title=f"run {seed}").read_bytes())
    assert not torch.allclose(scores[0], scores[1]) and pictures[0] != pictures[1]
    w = torch.rand(1, 2, 5, 5).softmax(-1) * 0.3  # a diffuse map: far below 1 everywhere
    for scale in ("shared", "head"):
        assert plot_attention_grid(w, list("abcde"), tmp_path / f"{scale}.png", "t", scale).is_file()
    with pytest.raises(ValueError, match="--scale x"):
        plot_attention_grid(w, list("abcde"), tmp_path / "x.png", scale="x")
