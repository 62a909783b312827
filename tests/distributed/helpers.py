"""Helpers for the scale-out tests: run the real CLI in subprocesses and read what they left.

Every Python process the tests start (the CLI, the ranks Lightning or torchrun start, joblib and
submitit workers) inherits PYTHONPATH=<procs dir>, whose sitecustomize.py appends one line
``pid<TAB>argv`` per interpreter start to $SCALELAB_TEST_PROC_LOG. So a test can count exactly
which processes ran, e.g. that no rank relaunched a sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]

SITECUSTOMIZE = '''
import os
_log = os.environ.get("SCALELAB_TEST_PROC_LOG")
if _log:  # the full command line (sys.argv lacks the -m module name this early)
    with open("/proc/self/cmdline", "rb") as _c:
        _argv = _c.read().decode(errors="replace").rstrip("\\0").split("\\0")
    with open(_log, "a") as _fh:
        _fh.write(f"{os.getpid()}\\t{chr(31).join(_argv)}\\n")
'''

# A model and run small enough for 2 CPU processes in seconds.
TINY = [
    "model=nano", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=32",
    "data=shakespeare", "tokenizer=char",
    "train.global_batch_size=8", "train.val_batches=2",
    "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1",
    "callbacks.sample.enabled=false",
]


def tiny_args(work: Path, data_file: Path, cache: Path, steps: int = 6) -> list[str]:
    return [*TINY, f"data.path={data_file}", f"train.max_steps={steps}", f"train.val_every={steps}",
            f"paths.data_dir={cache}", f"paths.log_dir={work / 'outputs'}",
            f"logger.tracking_uri=sqlite:///{work / 'mlflow.db'}",
            f"logger.artifact_root={work / 'mlartifacts'}",
            f"hydra.sweep.dir={work / 'multirun'}"]


def env_for(work: Path) -> dict[str, str]:
    procs = work / "procs"
    procs.mkdir(parents=True, exist_ok=True)
    (procs / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    for k in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(procs), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["SCALELAB_TEST_PROC_LOG"] = str(work / "procs.log")
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # 2 cores, 2 ranks
    return env


def run(cmd: list[str], work: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    work.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(cmd, cwd=REPO, env=env_for(work), capture_output=True, text=True,
                       timeout=timeout)
    (work / "stdout.txt").write_text(p.stdout)
    (work / "stderr.txt").write_text(p.stderr)
    assert p.returncode == 0, f"{' '.join(cmd)}\nrc={p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return p


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "scalelab.cli.train", *args]


def processes(work: Path) -> list[list[str]]:
    """argv of every Python process started under ``work`` (see the module docstring)."""
    log = work / "procs.log"
    lines = log.read_text().splitlines() if log.is_file() else []
    return [line.split("\t", 1)[1].split(chr(31)) for line in lines if "\t" in line]


def cli_processes(work: Path) -> list[list[str]]:
    """Processes that ran the training CLI (python -m scalelab.cli.train ...)."""
    return [a for a in processes(work) if "scalelab.cli.train" in a and "torch.distributed.run" not in a]


def runs(work: Path) -> list[Any]:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exps = client.search_experiments()
    return client.search_runs([e.experiment_id for e in exps], max_results=1000)


def run_folders(work: Path) -> list[Path]:
    """Run folders under <work>/outputs/<date>/ (single runs)."""
    root = work / "outputs"
    return sorted(p for p in root.glob("*/*") if p.is_dir()) if root.is_dir() else []


def summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text())


def eval_loss(ckpt: Path, windows: torch.Tensor) -> float:
    """Causal-LM loss of a checkpoint's weights on fixed windows [N, T+1], in this process."""
    from scalelab.model import ModelConfig, Transformer

    ck = torch.load(ckpt, map_location="cpu", weights_only=True)
    model = Transformer(ModelConfig.from_dict(model_config(ck)))
    prefix = model_prefix(ck["state_dict"])
    model.load_state_dict({k[len(prefix):]: v for k, v in ck["state_dict"].items() if k.startswith(prefix)})
    model.eval()
    with torch.no_grad():
        logits = model(windows[:, :-1])
        return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()))


def model_config(ck: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig dict a scalelab checkpoint carries."""
    from scalelab.training.checkpoint import model_config as stored_config

    cfg = stored_config(ck)
    assert cfg is not None, "no model config in the checkpoint"
    return cfg


def val_windows(data_cache: Path, n: int = 64, length: int = 33) -> torch.Tensor:
    """``n`` fixed windows of ``length`` tokens, evenly spaced over the prepared val split."""
    import numpy as np

    (val_bin,) = data_cache.glob("*/val.bin")
    meta = json.loads((val_bin.parent / "meta.json").read_text())
    val = np.memmap(val_bin, dtype=np.dtype(meta.get("dtype", "uint16")), mode="r")
    starts = np.linspace(0, len(val) - length, n).astype(np.int64)
    return torch.from_numpy(np.stack([val[s:s + length] for s in starts]).astype(np.int64))


def model_prefix(state_dict: dict[str, Any]) -> str:
    """'model.' (or whatever attribute holds the Transformer) from a LightningModule state dict."""
    key = next(k for k in state_dict if k.endswith("tok_emb.weight"))
    return key[: -len("tok_emb.weight")]
