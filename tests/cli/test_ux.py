"""A researcher's first hour: any Lightning option, run names, counts like 5e6.

Fast tests compose real configs through Hydra; the slow ones run `scalelab-train` for real.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from scalelab.cli import trainer_args
from scalelab.cli.naming import run_name
from scalelab.config.compose import normalize_overrides
from scalelab.config.counts import as_count
from scalelab.config.schema import register
from scalelab.config.spec import build_spec
from scalelab.paths import conf_dir


def make(*overrides: str):
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("train", overrides=normalize_overrides(list(overrides)))


def test_max_tokens_in_scientific_notation_is_a_count() -> None:
    spec = build_spec(make("train.max_tokens=5e6"))
    assert spec.max_steps == -(-5_000_000 // spec.batch.tokens_per_step)
    assert build_spec(make("train.max_steps=2e3")).max_steps == 2000
    assert as_count("k", "1_000") == 1000
    with pytest.raises(ValueError, match=r"train.max_tokens=2.5: must be a whole number"):
        build_spec(make("train.max_tokens=2.5"))
    with pytest.raises(ValueError, match=r"train.max_steps='many'"):
        build_spec(make("train.max_steps=many"))


def test_extra_trainer_arguments_reach_the_trainer() -> None:
    cfg = make("+trainer.max_time=00:00:00:05", "+trainer.gradient_clip_algorithm=value")
    trainer_args.check(cfg)
    assert trainer_args.extra_trainer_kwargs(cfg) == {
        "max_time": "00:00:00:05", "gradient_clip_algorithm": "value"}


@pytest.mark.parametrize(("override", "message"), [
    ("+trainer.max_tyme=1", "trainer.max_tyme is not a pytorch_lightning.Trainer argument"),
    ("+trainer.gradient_clip_val=1.0", "trainer.gradient_clip_val is set by scalelab; use optim.grad_clip"),
    ("+trainer.max_epochs=3", "use train.max_steps"),
])
def test_trainer_arguments_that_cannot_be_honoured_are_refused(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trainer_args.check(make(override))


def test_callbacks_with_a_target_are_instantiated() -> None:
    from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor

    cfg = make("+callbacks.lr_monitor={_target_: pytorch_lightning.callbacks.LearningRateMonitor}",
               "+callbacks.early_stop={_target_: pytorch_lightning.callbacks.EarlyStopping,"
               " monitor: val/loss, patience: 2}")
    trainer_args.check(cfg)
    cbs = trainer_args.user_callbacks(cfg)
    assert [type(c) for c in cbs] == [LearningRateMonitor, EarlyStopping]
    assert cbs[1].patience == 2


def test_run_names_carry_the_overrides_that_matter() -> None:
    assert run_name("pystdlib_small", []) == "pystdlib_small"
    assert run_name("pystdlib_small", [
        "model.n_layers=6", "optim.lr=3e-4", "paths.log_dir=/x", "logger.tracking_uri=y",
        "trainer.enable_progress_bar=false", "resume=true", "+experiment=pystdlib_small",
    ]) == "pystdlib_small,n_layers=6,lr=3e-4"
    assert run_name("e", ["model=llama_tiny", "+trainer.max_time=00:00:00:05"]) == \
        "e,model=llama_tiny,max_time=00:00:00:05"
    long = run_name("e", [f"model.k{i}={i}" for i in range(40)])
    assert len(long) <= 100 and ".." not in long
    # a folder name too: a path value keeps its last part, no separator survives
    assert run_name("e", ["data.path=/a/b/tiny.txt", "+x=[a/b]"]) == "e,path=tiny.txt,x=[a_b]"
    assert run_name("e", ["optim.lr=1", "run_name=mine"]) == "e"  # an explicit name wins


# --- end to end ----------------------------------------------------------------------------
TINY = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "train.global_batch_size=4", "train.val_batches=1", "callbacks.sample.enabled=false",
        "logger.log_checkpoint=false")


@pytest.mark.slow
def test_max_time_stops_the_run_and_the_terminal_is_plain(tmp_path: Path, train_cli) -> None:
    from mlflow.tracking import MlflowClient

    args = [*TINY, *train_cli.isolated(tmp_path), "trainer.enable_progress_bar=true",
            # Lightning's Timer checks after each step, so step 1 always trains: with a line and
            # a log row every step, what is asserted below comes however busy the machine is
            "train.max_steps=1e6", "train.val_every=20", "+trainer.max_time=00:00:00:04",
            "trainer.log_every_n_steps=1", "callbacks.progress_bar.plain_every=1",
            "+callbacks.lr_monitor={_target_: pytorch_lightning.callbacks.LearningRateMonitor}"]
    r = train_cli.run(*args, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "\r" not in r.stdout + r.stderr  # not a TTY: plain lines, no carriage-return frames
    assert re.search(r"step +1/1000000 ", r.stdout), r.stdout[-2000:]
    folder = next((tmp_path / "outputs").glob("*/*"))
    summary = json.loads((folder / "summary.json").read_text())
    assert 0 < summary["metrics"]["final/steps"] < 1_000_000  # the 4 s limit stopped it
    log = (folder / "train.log").read_text()
    for needle in ("MLflow UI", "FLOPs/token", "tokens planned", "1/1000000", "scalelab-train finished",
                   "[scalelab-data] "):  # data messages (preparing or reusing the cache)
        assert needle in log, needle
    # the CPU default trainer.precision=auto says what it chose and why (d_model 32: fp32 anywhere)
    assert re.search(r"precision     : 32-true \(auto: [^)]+\)", log), log[:3000]

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.get_run(summary["run_id"])
    assert run.data.params["precision"] == "32-true"  # what ran, not "auto"
    assert run.info.run_name.startswith("pystdlib_small,n_layers=1,d_model=32")
    assert len(run.info.run_name) <= 100  # long names end in a hash of the full name
    assert "lr/decay" in run.data.metrics  # LearningRateMonitor (per param group), from the CLI
    assert "epoch" not in run.data.metrics
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.slow
def test_resuming_a_finished_run_logs_nothing_twice(tmp_path: Path, train_cli) -> None:
    from mlflow.tracking import MlflowClient

    args = [*TINY, *train_cli.isolated(tmp_path), "train.val_every=5", "run_name=done"]
    first = train_cli.run(*args, "train.max_steps=12", timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    # a finished run is reopened only to add steps; its final values are replaced
    again = train_cli.run(*args, "train.max_steps=16", "resume=true",
                          "train.resume_schedule=continue", timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "dataloader is not resumable" not in again.stdout + again.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    assert run.info.run_name == "done"  # an explicit run_name wins
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    assert not [k for k in run.data.metrics if k.startswith("final/")]
    assert float(run.data.tags["final.steps"]) == 16


# scalelab-train, then how often its jobs opened an MLflow client (and how often one was reused)
COUNTED = """
import sys
from scalelab.cli.train import main
sys.argv[0] = "scalelab-train"
try:
    main()
finally:
    from scalelab.tracking.run import client_for
    print("CLIENTS", client_for.cache_info().misses, client_for.cache_info().hits, flush=True)
"""


@pytest.mark.slow
def test_multirun_jobs_carry_their_values_under_a_parent(tmp_path: Path, train_cli) -> None:
    from mlflow.tracking import MlflowClient

    r = subprocess.run([sys.executable, "-c", COUNTED, "-m", "model.n_layers=1,2", *TINY[1:],
                        *train_cli.isolated(tmp_path), "train.max_steps=3",
                        f"hydra.sweep.dir={tmp_path / 'mr'}"], cwd=train_cli.repo,
                       env=train_cli.env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # one client for the store, opened once: the parent run and both jobs' runs reuse it
    opened, reused = next(ln.split()[1:] for ln in r.stdout.splitlines()
                          if ln.startswith("CLIENTS"))
    assert opened == "1" and int(reused) >= 2, r.stdout[-2000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    parents = [x for x in runs if "mlflow.parentRunId" not in x.data.tags]
    kids = sorted((x for x in runs if "mlflow.parentRunId" in x.data.tags), key=lambda x: x.info.run_name)
    assert len(parents) == 1 and parents[0].info.run_name == "pystdlib_small (multirun)"
    # one name per job: its MLflow run, its folder (<job number>_<name>), its summary.json
    assert [k.info.run_name.split(",")[:2] for k in kids] == [["pystdlib_small", "n_layers=1"],
                                                              ["pystdlib_small", "n_layers=2"]]
    for num, kid in enumerate(kids):
        folder = Path(kid.data.tags["scalelab.output_dir"])
        assert folder.parent == tmp_path / "mr" and folder.name == f"{num}_{kid.info.run_name}"
        assert json.loads((folder / "summary.json").read_text())["run_name"] == kid.info.run_name
    assert {k.data.tags["mlflow.parentRunId"] for k in kids} == {parents[0].info.run_id}
    assert "model.n_layers=2" in kids[1].data.tags["scalelab.overrides"]
    assert parents[0].info.status == "FINISHED"
    for kid, n_layers in zip(kids, ("1", "2"), strict=True):  # each job's own params and values
        assert kid.info.status == "FINISHED" and kid.data.params["n_layers"] == n_layers
        assert len(client.get_metric_history(kid.info.run_id, "val/loss")) == 1


def test_git_tags_come_from_the_source_tree_not_the_output_root(tmp_path: Path) -> None:
    from scalelab.tracking.meta import run_tags

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                          capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    tags = run_tags(tmp_path)  # an output root outside any repository
    assert tags["git.commit"] == head.stdout.strip()
    assert tags["git.dirty"] in ("true", "false")


def test_final_values_read_tags_and_older_metrics() -> None:
    from scalelab.tracking import final_values

    assert final_values({"final.val_loss": "2.5", "final.steps": "12", "other": "x"},
                        {"final/val_bpb": 3.0, "val/loss": 2.6}) == {
        "val_loss": 2.5, "steps": 12.0, "val_bpb": 3.0}


def test_vocab_alignment_hint_only_for_an_unaligned_vocabulary_on_a_gpu() -> None:
    from scalelab.cli.banner import vocab_alignment_hint

    hint = vocab_alignment_hint(50260, on_gpu=True)
    assert hint is not None and "model.vocab_size=50304" in hint
    assert vocab_alignment_hint(50304, on_gpu=True) is None
    assert vocab_alignment_hint(50260, on_gpu=False) is None  # measured to pay on a GPU only
