"""Training against a real `mlflow server` over HTTP; everything read back through MlflowClient."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.slow
def test_run_logged_to_tracking_server(tmp_path: Path, shared_data_dir: Path, mlflow_server: str,
                                       train_cli) -> None:
    from mlflow.tracking import MlflowClient

    from scalelab.model import ModelConfig

    client = MlflowClient(mlflow_server)
    exp_id = client.create_experiment("server_test")
    parent = client.create_run(exp_id, run_name="parent").info.run_id

    r = train_cli.run(
        "model=gpt2_tiny", "data=shakespeare", "tokenizer=char", "train.global_batch_size=12", "run_name=child",
        f"data.path={shared_data_dir / 'tinyshakespeare.txt'}",
        "train.max_steps=40", "train.val_every=20", "train.val_batches=2", "optim.warmup_steps=4",
        "callbacks.sample.max_new_tokens=30",
        "logger.experiment_name=server_test", f"logger.parent_run_id={parent}",
        "logger.system_metrics=true", "logger.system_metrics_interval=1", "+tags.purpose=test",
        *train_cli.isolated(tmp_path, tracking_uri=mlflow_server),
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    children = client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 1
    run = children[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "child"

    p = run.data.params
    for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "arch", "norm",
                "norm_position", "mlp", "position", "vocab_size", "block_size", "seq_len",
                "n_params", "n_params_non_embedding", "n_params_matmul", "flops_per_token",
                "flops_per_token_6n", "tokens_budget", "compute", "lr", "global_batch_sequences",
                "global_batch_tokens", "micro_batch", "grad_accum", "world_size", "strategy",
                "tokenizer", "dataset", "config_hash"):
        assert key in p, key
    cfg = ModelConfig(vocab_size=int(p["vocab_size"]), max_seq_len=64, d_model=64, n_layers=2, n_heads=4)
    assert int(p["n_params"]) == cfg.n_params()
    assert int(p["flops_per_token"]) == cfg.flops_per_token(seq_len=64)
    assert int(p["tokens_budget"]) == 40 * 12 * 64
    assert int(p["compute"]) == cfg.flops_per_token(seq_len=64) * 40 * 12 * 64
    assert (p["tokenizer"], p["dataset"], p["world_size"]) == ("char", "shakespeare", "1")

    m = run.data.metrics
    for key in ("train/loss", "val/loss", "val/bpb", "lr", "tokens_seen", "tokens_per_sec"):
        assert key in m, (key, sorted(m))
    # final values are tags (not one-point charts); no Lightning `epoch`, no final/loss twins
    assert not [k for k in m if k.startswith("final/") or k == "epoch"], sorted(m)
    final = {k: v for k, v in run.data.tags.items() if k.startswith("final.")}
    assert {"final.val_loss", "final.tokens_seen", "final.val_bpb"} <= set(final), final
    assert not {"final.loss", "final.ppl", "final.bpb"} & set(final), final
    assert float(final["final.val_loss"]) == pytest.approx(m["val/loss"])
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(history) >= 3 and len({h.step for h in history}) == len(history)
    assert any(k.startswith("system/") for k in m), sorted(m)  # psutil-based system metrics

    t = run.data.tags
    for key in ("command", "host", "scalelab.version", "scalelab.output_dir", "purpose"):
        assert key in t, key
    assert t["purpose"] == "test"
    cmd = t["command"].split()
    assert cmd[0] in ("train.py", "scalelab-train") and "run_name=child" in cmd, t["command"]
    import subprocess

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=train_cli.repo, capture_output=True,
                          text=True)
    if head.returncode == 0:  # a git checkout (CI, dev): the run names its exact commit
        assert t["git.commit"] == head.stdout.strip()
        assert t["git.dirty"] in ("true", "false")
    else:  # an unpacked sdist: no git tags rather than wrong ones
        assert "git.commit" not in t

    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config", "checkpoints", "sample.txt"} <= arts, arts
    cfg_files = {a.path for a in client.list_artifacts(run.info.run_id, "config")}
    assert cfg_files == {"config/config.yaml", "config/overrides.txt"}
    ckpts = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert ckpts == ["checkpoints/last.ckpt"]  # the final checkpoint, once
    local = client.download_artifacts(run.info.run_id, "config/config.yaml", str(tmp_path))
    text = Path(local).read_text()
    assert "d_model: 64" in text and "parent_run_id: " + parent in text


@pytest.mark.slow
def test_dead_tracking_server_fails_fast_with_a_clear_error(tmp_path: Path, train_cli) -> None:
    from conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    r = train_cli.run(f"logger.tracking_uri={dead}", *train_cli.isolated(tmp_path, tracking_uri=dead),
                      timeout=300)
    assert r.returncode != 0
    assert "unreachable" in r.stderr and dead in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    # refused on the first try: no wait for MLflow's own retries, nor the probe's for a busy server
    assert "slow to answer" not in r.stdout + r.stderr
