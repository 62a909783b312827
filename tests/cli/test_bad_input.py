"""Bad input to real `scalelab-train` / `scalelab-sample` / `scalelab-export` processes: one line
naming the key or file and the fix, exit code 2, no traceback, and no folder left behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.conftest import free_port

from scalelab.data.tokenizers import can_connect

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _readonly_tmpfs(path: Path) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    # what the user sees: stderr without PYTHONPROFILEIMPORTTIME's lines, where a test asks for them
    err = "\n".join(line for line in r.stderr.splitlines() if not line.startswith("import time:"))
    assert r.returncode == 2, r.stdout[-2000:] + err[-3000:]
    assert "Traceback" not in err and "weights_only" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def _imported(stderr: str) -> set[str]:
    """The modules a process imported, from its ``PYTHONPROFILEIMPORTTIME`` lines."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def _garbage(tmp: Path) -> Path:
    p = tmp / "garbage.ckpt"
    # b"\x80\xaf": a pickle PROTO opcode with protocol 175, which makes torch warn before it
    # fails (random bytes did so about 1 run in 256); the warning must not reach the user either
    p.write_bytes(b"\x80\xaf" + os.urandom(4094))
    return p


def _truncated(tmp: Path) -> Path:
    p = tmp / "trunc.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(10_000)}}, p)
    p.write_bytes(p.read_bytes()[:20_000])
    return p


@pytest.mark.parametrize(("case", "needles"), [
    ("resume_no_run", ["resume=true", "no earlier run named 'nobody'"]),
    ("unknown_model_key", ["model.some_unknown_key", "+model.some_unknown_key"]),
    ("garbage_ckpt_path", ["garbage.ckpt", "not a usable checkpoint"]),
    ("truncated_init_from", ["train.init_from", "trunc.ckpt", "truncated"]),
    ("root_is_a_file", ["paths.log_dir", "is a file", "SCALELAB_ROOT"]),
    ("root_read_only", ["paths.log_dir", "read-only", "SCALELAB_ROOT"]),
    ("data_dir_read_only", ["paths.data_dir", "Read-only file system"]),
    ("download_offline", ["could not download", "data.path=/path/to/file"]),
    ("tokenizer_offline", ["tokenizer.name=gpt2", "TIKTOKEN_CACHE_DIR", "tokenizer=char"]),
    ("unknown_optim_key", ["optim.momentum"]),
    ("split_shorter_than_a_window", ["val.bin has 30 tokens", "fewer than the 33", "train.block_size=32 + 1"]),
])
def test_bad_train_input_is_one_line_and_leaves_no_folder(case: str, needles: list[str],
                                                          tmp_path: Path, train_cli) -> None:
    args = ["model=gpt2_tiny", "data=pystdlib", "data.max_bytes=100000", "tokenizer=byte",
            "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32",
            "train.max_steps=3", *train_cli.isolated(tmp_path, seed_store=False)]
    env = train_cli.env(PYTHONPROFILEIMPORTTIME="1")  # which modules the process imported
    with contextlib.ExitStack() as stack:
        if case == "resume_no_run":
            args += ["resume=true", "run_name=nobody"]
        elif case == "unknown_model_key":
            args += ["+model.some_unknown_key=1"]
        elif case == "unknown_optim_key":  # a key the optimizer does not have
            args += ["+optim.momentum=0.9"]
        elif case == "garbage_ckpt_path":
            args += [f"ckpt_path={_garbage(tmp_path)}"]
        elif case == "truncated_init_from":
            args += [f"train.init_from={_truncated(tmp_path)}"]
        elif case in ("root_is_a_file", "root_read_only"):
            if case == "root_is_a_file":
                root = tmp_path / "root_file"
                root.write_text("not a folder\n")
            else:
                root = stack.enter_context(_readonly_tmpfs(tmp_path / "ro_root"))
            env["SCALELAB_ROOT"] = str(root)
            args = [a for a in args if not a.startswith("paths.log_dir=")]
        elif case == "download_offline":  # nothing listens on a port we just freed
            args = [a for a in args if not a.startswith("data")]
            args += ["data=shakespeare", f"data.url=http://127.0.0.1:{free_port()}/input.txt",
                     "data.download_timeout=5", f"paths.data_dir={tmp_path / 'cache'}"]
        elif case == "tokenizer_offline":
            if can_connect("openaipublic.blob.core.windows.net", 443, 3.0):
                pytest.skip("online: the encoding would download")
            args = [a.replace("tokenizer=byte", "tokenizer=gpt2") for a in args]
            args += [f"paths.data_dir={tmp_path / 'cache'}"]
            env["TIKTOKEN_CACHE_DIR"] = str(tmp_path / "no_tiktoken_cache")
        elif case == "split_shorter_than_a_window":  # 300 bytes: 30 val tokens, windows of 33
            corpus = tmp_path / "tiny.txt"
            corpus.write_text("First Citizen: hear me speak. " * 10)
            args = [a for a in args if not a.startswith("data")]
            args += ["data=shakespeare", f"data.path={corpus}", f"paths.data_dir={tmp_path / 'shards'}"]
        elif case == "data_dir_read_only":
            ro = stack.enter_context(_readonly_tmpfs(tmp_path / "ro_data"))
            args += [f"paths.data_dir={ro / 'cache'}"]
        r = train_cli.run(*args, env=env, timeout=300)
    line = _one_line(r)
    for needle in needles:
        assert needle in line, line
    # every input is checked before Lightning is imported: a typo is reported in a second or
    # two, not after the seconds Lightning's import takes
    assert "pytorch_lightning" not in _imported(r.stderr), line
    outputs = tmp_path / "outputs"
    assert not outputs.exists() or not any(outputs.rglob(".hydra")), sorted(outputs.rglob("*"))
    assert not (tmp_path / "mlruns.db").exists()  # no MLflow run either
    if (tmp_path / "cache").is_dir():  # no half-prepared data folder (a lock file may stay)
        assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]


@pytest.mark.parametrize(("tool", "make"), [("sample", _garbage), ("export", _truncated)])
def test_broken_checkpoint_in_sample_and_export(tool: str, make, tmp_path: Path) -> None:
    ck = make(tmp_path)
    extra = ["--out", str(tmp_path / "exported")] if tool == "export" else []
    r = subprocess.run([sys.executable, "-m", f"scalelab.cli.{tool}", str(ck), *extra],
                       capture_output=True, text=True, timeout=120)
    line = _one_line(r)
    assert str(ck) in line and "not a usable checkpoint" in line, line
    assert not (tmp_path / "exported").exists()


def test_code_in_a_checkpoint_never_runs_even_when_torch_is_told_to_allow_it(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": Payload()}, evil)
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    for tool, extra in (("sample", []), ("export", ["--out", str(tmp_path / "e")])):
        r = subprocess.run([sys.executable, "-m", f"scalelab.cli.{tool}", str(evil), *extra],
                           env=env, capture_output=True, text=True, timeout=120)
        assert "could run code" in _one_line(r)
        assert not marker.exists(), f"scalelab-{tool} ran the checkpoint's code"
