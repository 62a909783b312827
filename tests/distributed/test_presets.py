"""Fast checks of the scale-out presets and helpers (no training, no subprocess)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from scalelab.config.schema import register
from scalelab.model.blocks import Block, CrossBlock
from scalelab.paths import conf_dir
from scalelab.training import devices
from scalelab.training import distributed as D


def _compose(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_fsdp_preset_composes_and_builds_per_block_strategy():
    cfg = _compose("trainer=fsdp", "trainer.devices=8")
    t = cfg.trainer
    assert (t.accelerator, t.strategy, t.precision, t.devices) == ("gpu", "fsdp", "bf16-mixed", 8)
    assert t.fsdp.state_dict_type == "sharded" and t.fsdp.auto_wrap == "block"
    strategy = D.build_strategy("fsdp", "gpu", fsdp=OmegaConf.to_container(t.fsdp, resolve=True))
    assert isinstance(strategy, D.ScalelabFSDPStrategy)
    policy = strategy.kwargs["auto_wrap_policy"]
    assert set(policy._module_classes) == {Block, CrossBlock}  # one FSDP unit per block
    mp_cfg = strategy.mixed_precision
    assert (mp_cfg.param_dtype, mp_cfg.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert strategy._state_dict_type == "sharded"
    assert str(strategy.sharding_strategy).endswith("FULL_SHARD")


def test_fsdp_on_cpu_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match=r"trainer\.accelerator=gpu"):
        D.build_strategy("fsdp", "cpu")


def test_ddp_is_lightnings_own_strategy_and_one_process_starts_no_rank():
    from pytorch_lightning.strategies import DDPStrategy

    def child(rank: int):
        raise AssertionError("one process per node: no rank to start")

    s = D.build_strategy("ddp", "cpu", child_command=child, num_processes=1)
    assert type(s) is DDPStrategy and D._saved_env is None
    assert D.build_strategy("auto", "cpu") == "auto"


def test_multinode_preset():
    t = _compose("trainer=multinode").trainer
    assert (t.strategy, t.num_nodes, t.devices, t.accelerator) == ("ddp", 2, 8, "gpu")


def test_slurm_launcher_preset_renders_a_multi_gpu_sbatch(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    cfg = _compose("hydra/launcher=slurm", "trainer=multinode", "trainer.num_nodes=2",
                   "trainer.devices=4", "hydra.launcher.partition=gpu",
                   "hydra.launcher.account=proj123", "hydra.launcher.timeout_min=90")
    lc = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert lc["_target_"].endswith("SlurmLauncher")
    assert (lc["nodes"], lc["gpus_per_node"], lc["tasks_per_node"]) == (2, 4, 4)
    # Same parameter mapping as hydra_submitit_launcher's launch(), then submitit's own sbatch text.
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    base = set(OmegaConf.structured(BaseQueueConf).keys())
    params = {k if k in base else f"slurm_{k}": v for k, v in lc.items()
              if k not in ("_target_", "submitit_folder", "max_num_timeout")}
    # No SLURM here: skip only submitit's "is srun on PATH" probe, keep its sbatch rendering.
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", staticmethod(lambda: 1))
    ex = submitit.AutoExecutor(cluster="slurm", folder=tmp_path)
    ex.update_parameters(**params)
    text = ex._executor._make_submission_file_text("python -m scalelab.cli.train", "uid")
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj123", "#SBATCH --time=90",
                 "#SBATCH --signal=USR1@90"):  # the pre-timeout signal scalelab-train requeues on
        assert line in text, text


@pytest.mark.parametrize("launcher,target", [
    ("basic", "BasicLauncher"), ("joblib", "JoblibLauncher"), ("submitit_local", "LocalLauncher"),
])
def test_local_launcher_presets_compose(launcher: str, target: str):
    cfg = _compose(f"hydra/launcher={launcher}")
    assert cfg.hydra.launcher._target_.endswith(target)


def _claim(lock_dir: str, out, hold) -> None:
    idx, _fh = devices.claim_device(lock_dir, 2, timeout_s=5)
    out.put(idx)
    hold.get(timeout=30)  # keep the lock until the parent has seen both claims


def test_claim_device_gives_parallel_jobs_distinct_devices(tmp_path: Path):
    ctx = mp.get_context("fork")
    out, hold = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), out, hold)) for _ in range(2)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=30) for _ in procs)
    for _ in procs:
        hold.put(None)
    for p in procs:
        p.join(10)
    assert got == [0, 1]


def test_torchrun_layout(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # what torchrun sets in every rank
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert devices.torchrun_layout() == (4, 2)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert devices.torchrun_layout() is None


def test_consolidate_rejects_a_plain_file(tmp_path: Path):
    from scalelab.training.checkpoint import consolidate_checkpoint

    f = tmp_path / "x.ckpt"
    f.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="not a sharded checkpoint"):
        consolidate_checkpoint(f)


def test_resolve_devices(monkeypatch: pytest.MonkeyPatch):
    assert devices.resolve_devices("cpu", "auto", 1) == ("auto", 1, 1)
    assert devices.resolve_devices("cpu", 2, 1)[2] == 2
    assert devices.resolve_devices("gpu", [0, 1], 2)[2] == 4
    assert devices.resolve_devices("gpu", "0,1,", 1)[2] == 2
    with pytest.raises(ValueError, match=r"trainer\.devices"):
        devices.resolve_devices("cpu", "many", 1)
    # under torchrun, devices=auto follows torchrun's layout
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # what torchrun sets in every rank
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert devices.resolve_devices("cpu", "auto", 1) == (2, 1, 2)


def test_weight_decay_groups_survive_fsdp_flattening():
    """FSDP1 (use_orig_params) makes every parameter a 1-D view of its shard; the optimizer's
    decay/no-decay split must still see matrices as matrices (ScalelabFSDPStrategy.setup)."""
    from scalelab.model import ModelConfig, Transformer
    from scalelab.training.optim import param_groups

    model = Transformer(ModelConfig(vocab_size=65, max_seq_len=16, d_model=32, n_layers=2, n_heads=2))
    _, before = param_groups(model, 0.1)
    D.tag_original_ndim(model)
    for p in model.parameters():  # what FSDP's sharded views look like
        p.data = p.data.flatten()[: max(1, p.numel() // 2)]
    _, after = param_groups(model, 0.1)
    assert after.decay_names == before.decay_names and after.no_decay_names == before.no_decay_names
    assert before.decay_tensors > 0
