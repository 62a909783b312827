"""Callbacks as a Hydra group: presets in conf/callbacks/ picked from the command line
(`callbacks=early_stopping`, `'callbacks=[early_stopping,lr_monitor]'`), inline
`+callbacks.<name>={_target_: ...}` entries, and the one-line refusals of entries that cannot be built.

Fast tests compose real configs through Hydra; the slow ones train a tiny model for real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from scalelab.cli import trainer_args
from scalelab.cli.user_callbacks import platform_keys
from scalelab.config.compose import compose, normalize_overrides
from scalelab.paths import conf_dir

from .test_bad_input import _one_line

PRESETS = sorted(p.stem for p in (conf_dir() / "callbacks").glob("*.yaml"))


def make(*overrides: str):
    return compose("train", normalize_overrides(list(overrides)))


def test_the_presets_are_there() -> None:
    for name in ("default", "none", "early_stopping", "lr_monitor", "on_exception_checkpoint",
                 "model_summary", "rich_model_summary"):
        assert name in PRESETS


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_checks_and_instantiates(preset: str) -> None:
    cfg = make(f"callbacks={preset}")
    cfg.paths.output_dir = "/tmp/run"  # what train() sets before it builds the callbacks
    trainer_args.check(cfg)
    built = trainer_args.user_callbacks(cfg)
    extra = [k for k in cfg.callbacks if k not in platform_keys()]
    assert len(built) == len(extra) == (0 if preset in ("default", "none") else 1)
    if preset == "on_exception_checkpoint":
        assert built[0].ckpt_path == "/tmp/run/checkpoints/on_exception.ckpt"  # the run folder


def test_a_preset_keeps_the_platform_callbacks_and_none_turns_them_off() -> None:
    default = OmegaConf.to_container(make().callbacks)
    # a preset holds only its entry: the platform keys keep train.yaml's values
    picked = OmegaConf.to_container(make("callbacks=early_stopping").callbacks)
    assert {k: v for k, v in picked.items() if k != "early_stopping"} == default
    several = make("callbacks=[early_stopping,lr_monitor,on_exception_checkpoint]").callbacks
    assert list(several)[-3:] == ["early_stopping", "lr_monitor", "on_exception_checkpoint"]
    assert make("callbacks=[default,lr_monitor]").callbacks.lr_monitor  # the long form works too
    off = make("callbacks=[none,early_stopping]").callbacks
    assert not (off.checkpoint.enabled or off.sample.enabled or off.throughput.enabled)
    assert off.early_stopping.monitor == "val/loss"
    assert make("callbacks=early_stopping", "callbacks.early_stopping.patience=7").callbacks.early_stopping.patience == 7
    dropped = make("callbacks=[early_stopping,lr_monitor]", "callbacks.early_stopping=null")
    trainer_args.check(dropped)
    assert [type(c).__name__ for c in trainer_args.user_callbacks(dropped)] == ["LearningRateMonitor"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["+callbacks.es={_target_: pytorch_lightning.callbacks.EarlyStoping}"],
     "callbacks.es._target_='pytorch_lightning.callbacks.EarlyStoping': cannot import it "
     "(pytorch_lightning.callbacks has no 'EarlyStoping')"),
    (["+callbacks.es={_target_: nosuchpackage.EarlyStopping}"],
     "callbacks.es._target_='nosuchpackage.EarlyStopping': cannot import it "
     "(ModuleNotFoundError: No module named 'nosuchpackage')"),
    (["+callbacks.es={_target_: EarlyStopping}"], "give the full class path"),
    (["+callbacks.es={_target_: collections.OrderedDict}"], "is not a pytorch_lightning.Callback class"),
    (["callbacks=early_stopping", "+callbacks.early_stopping.patiense=2"],
     "callbacks.early_stopping (EarlyStopping): got an unexpected keyword argument 'patiense'"),
    (["+callbacks.early_stopping={patience: 2}"], "callbacks.early_stopping has no _target_"),
    (["+callbacks.bar={_target_: pytorch_lightning.callbacks.RichProgressBar}"],
     "callbacks.bar: scalelab draws its own progress bar"),
    (["callbacks=[none,on_exception_checkpoint]"],
     "callbacks.on_exception_checkpoint (OnExceptionCheckpoint) saves checkpoints, but checkpointing is off"),
])
def test_an_entry_that_cannot_be_built_is_refused_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        trainer_args.check(make(*overrides))


# --- end to end ----------------------------------------------------------------------------
TINY = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "train.global_batch_size=4", "train.val_batches=1", "callbacks.sample.enabled=false",
        "logger.log_checkpoint=false", "data.max_bytes=200000", "trainer.log_every_n_steps=1")


def _folder(tmp_path: Path) -> Path:
    return next(p for p in (tmp_path / "outputs").glob("*/*") if (p / "summary.json").exists())


@pytest.mark.slow
def test_early_stopping_ends_the_run_early_and_lr_monitor_reaches_mlflow(tmp_path: Path, train_cli) -> None:
    from mlflow.tracking import MlflowClient

    # min_delta=10: the second validation cannot improve enough, patience 1 stops at once
    r = train_cli.run(*TINY, *train_cli.isolated(tmp_path), "train.max_steps=60", "train.val_every=3",
                      "callbacks=[early_stopping,lr_monitor]", "callbacks.early_stopping.patience=1",
                      "callbacks.early_stopping.min_delta=10", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    folder = _folder(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "FINISHED"
    assert summary["metrics"]["final/steps"] == 6 < 60  # validations at 3 and 6, stopped at 6
    assert "stopped early at step 6: Monitored metric val/loss did not improve" in r.stdout + r.stderr
    assert "stopped early at step 6" in (folder / "train.log").read_text()

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["scalelab.stopped_early"].startswith("stopped early at step 6")
    monitored = [k for k in run.data.metrics if k.startswith("lr/")]  # LearningRateMonitor: lr/<group>
    assert monitored, sorted(run.data.metrics)
    history = client.get_metric_history(run.info.run_id, monitored[0])
    assert len(history) >= 5 and all(m.value > 0 for m in history)


@pytest.mark.slow
def test_on_exception_checkpoint_saves_the_state_when_training_raises(tmp_path: Path, train_cli) -> None:
    tests_dir = Path(__file__).resolve().parents[1]  # `cli.raise_at_step` for the child process
    env = train_cli.env(PYTHONPATH=os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")]))
    r = train_cli.run(*TINY, *train_cli.isolated(tmp_path), "train.max_steps=60", "train.val_every=50",
                      "callbacks=on_exception_checkpoint",
                      "+callbacks.boom={_target_: cli.raise_at_step.RaiseAtStep, step: 4}",
                      env=env, timeout=600)
    assert r.returncode != 0 and "raised on purpose at step 4" in r.stderr, r.stderr[-3000:]
    folder = next((tmp_path / "outputs").glob("*/*"))
    ckpt = folder / "checkpoints" / "on_exception.ckpt"
    assert ckpt.exists(), sorted(folder.rglob("*"))
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"] == 4
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "FAILED"


@pytest.mark.slow
def test_a_bad_target_is_one_line_and_leaves_nothing_behind(tmp_path: Path, train_cli) -> None:
    r = train_cli.run(*TINY, *train_cli.isolated(tmp_path, seed_store=False), "train.max_steps=3",
                      "+callbacks.es={_target_: pytorch_lightning.callbacks.EarlyStoping, monitor: val/loss}")
    line = _one_line(r)
    assert line.startswith("error: callbacks.es._target_='pytorch_lightning.callbacks.EarlyStoping'"), line
    assert "Error getting object" not in r.stderr, r.stderr[-3000:]  # Hydra's own log lines
    outputs = tmp_path / "outputs"
    assert not outputs.exists() or not any(outputs.rglob(".hydra")), sorted(outputs.rglob("*"))
    assert not (tmp_path / "mlruns.db").exists()  # no MLflow run either


def test_the_throughput_window_follows_the_logging_cadence_unless_set(tmp_path: Path) -> None:
    from scalelab.cli.trainer_build import scalelab_callbacks
    from scalelab.config.spec import build_spec
    from scalelab.training import ThroughputMonitor

    for overrides, window in (((), None), (("callbacks.throughput.window=40",), 40)):
        built = scalelab_callbacks(build_spec(make(*overrides)), tmp_path, {}, [])
        assert [c.every_n_steps for c in built if isinstance(c, ThroughputMonitor)] == [window]
