"""The checkpoint format (scalelab.training.checkpoint) and atomic files (scalelab.data.files):
written in place with a hash sidecar, verified before use, a full disk (a real 3 MB tmpfs) gives
a clear error and leaves the previous file intact, broken files are one line, and a crafted FSDP
folder cannot run code even with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1."""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from scalelab.data.files import atomic_write_json, atomic_write_text
from scalelab.training.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    newest_verified,
    read_checkpoint,
    read_sharded,
    sidecar_path,
    verify,
    write_checkpoint,
)
from scalelab.training.checkpoint_io import VerifiedCheckpointIO


def _ckpt(step: int, n: int = 64) -> dict:
    return {"state_dict": {"model.w": torch.arange(n, dtype=torch.float32)}, "global_step": step,
            "scalelab_run": {"model_config": {"d_model": 4}}}


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_write_verify_and_detect_truncation(tmp_path: Path) -> None:
    p = tmp_path / "checkpoints" / "last.ckpt"
    write_checkpoint(_ckpt(7), p)
    assert sidecar_path(p).is_file() and verify(p) is None
    assert read_checkpoint(p)["global_step"] == 7
    assert [f.name for f in p.parent.iterdir() if f.name.startswith(".")] == []  # no temp left
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    assert "truncated" in verify(p)
    p.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    assert "SHA-256" in verify(p)
    sidecar_path(p).unlink()  # no sidecar: must at least load
    p.write_bytes(data[: len(data) // 2])
    assert "truncated" in verify(p)


def test_resume_choice_skips_what_does_not_verify(tmp_path: Path) -> None:
    d = tmp_path / "checkpoints"
    write_checkpoint(_ckpt(5), d / "best.ckpt")
    write_checkpoint(_ckpt(6), d / "step_6.ckpt")
    write_checkpoint(_ckpt(9), d / "last.ckpt")
    os.utime(d / "best.ckpt", (1, 1))  # older than step_6
    assert newest_verified(d) == (d / "last.ckpt", [])
    (d / "last.ckpt").write_bytes((d / "last.ckpt").read_bytes()[:100])
    chosen, skipped = newest_verified(d)
    assert chosen == d / "step_6.ckpt"
    assert [(p.name, "truncated" in why) for p, why in skipped] == [("last.ckpt", True)]
    (d / "step_6.ckpt").write_bytes(b"garbage")
    chosen, skipped = newest_verified(d)
    assert chosen == d / "best.ckpt" and [p.name for p, _ in skipped] == ["last.ckpt", "step_6.ckpt"]


def test_broken_files_are_one_line_without_torch_advice(tmp_path: Path) -> None:
    garbage = tmp_path / "g.ckpt"
    garbage.write_text("not a checkpoint\n")
    empty = tmp_path / "e.ckpt"
    empty.write_bytes(b"")
    plain = tmp_path / "p.ckpt"
    torch.save({"weights": torch.zeros(2)}, plain)
    for f, needle in ((garbage, "not a torch checkpoint"), (empty, "truncated"),
                      (plain, "no state_dict"), (tmp_path / "missing.ckpt", "no such")):
        with pytest.raises(CheckpointError) as e:
            read_checkpoint(f)
        msg = str(e.value)
        assert needle in msg and str(f) in msg and "\n" not in msg, msg
        assert "weights_only" not in msg


def test_checkpoint_io_removes_the_sidecar_with_the_file(tmp_path: Path) -> None:
    io = VerifiedCheckpointIO()
    p = tmp_path / "best.ckpt"
    io.save_checkpoint(_ckpt(1), p)
    assert io.load_checkpoint(p)["global_step"] == 1
    io.remove_checkpoint(p)
    assert not p.exists() and not sidecar_path(p).exists()


_DIES_MID_SAVE = """
import os, sys, torch
import scalelab.training.checkpoint as C
path, where = sys.argv[1], sys.argv[2]
def ckpt(step):
    return {"state_dict": {"model.w": torch.arange(64, dtype=torch.float32) * step}, "global_step": step}
C.write_checkpoint(ckpt(1), path)
if where == "before_rename":
    os.replace = lambda *a, **k: os._exit(9)
else:  # after the rename, before the new sidecar
    C.atomic_write_json = lambda *a, **k: os._exit(9)
C.write_checkpoint(ckpt(2), path)
"""


@pytest.mark.parametrize(("where", "step"), [("before_rename", 1), ("before_sidecar", 2)])
def test_a_process_killed_mid_save_leaves_a_checkpoint_resume_can_use(
        tmp_path: Path, where: str, step: int) -> None:
    """A real process dies inside its second save of last.ckpt (a sweep SIGKILLed while a point
    saved): resume must still find a usable last.ckpt, the old one or the new one. The new file
    beside the old sidecar once failed its hash ("no usable checkpoint"; same size, so only the
    SHA-256 told)."""
    p = tmp_path / "checkpoints" / "last.ckpt"
    proc = subprocess.run([sys.executable, "-c", _DIES_MID_SAVE, str(p), where], timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert verify(p) is None
    assert newest_verified(p.parent) == (p, [])
    assert read_checkpoint(p)["global_step"] == step


def test_full_disk_names_the_path_and_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "3m") as disk:
        p = disk / "checkpoints" / "last.ckpt"
        write_checkpoint(_ckpt(1, n=100_000), p)  # 400 kB: fits
        before = p.read_bytes()
        with pytest.raises(CheckpointWriteError) as e:
            write_checkpoint(_ckpt(2, n=1_000_000), p)  # 4 MB: does not
        assert str(p) in str(e.value) and "No space left" in str(e.value)
        assert "[Errno" not in str(e.value)
        assert p.read_bytes() == before and verify(p) is None  # old one intact and trusted
        assert sorted(f.name for f in p.parent.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]


def test_atomic_text_and_json_leave_the_old_file_on_a_full_disk(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        target = disk / "summary.json"
        atomic_write_json(target, {"status": "RUNNING"})
        with pytest.raises(OSError):
            atomic_write_text(target, "x" * 2_000_000)
        assert target.read_text().strip().endswith("}")
        assert [f.name for f in disk.iterdir()] == ["summary.json"]


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _malicious_sharded(folder: Path, marker: Path, where: str) -> None:
    """A real DCP folder, then one part replaced by a pickle that runs ``touch marker``."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.zeros(3)}}, checkpoint_id=str(folder), no_dist=True)
    torch.save({"global_step": 1}, folder / "meta.pt")
    if where == ".metadata":
        (folder / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    else:
        with open(folder / "meta.pt", "wb") as f:
            pickle.dump(_Payload(marker), f)  # what a legacy torch.load would unpickle


@pytest.mark.parametrize("where", [".metadata", "meta.pt"])
def test_crafted_sharded_checkpoint_runs_no_code(tmp_path: Path, where: str) -> None:
    folder, marker = tmp_path / "last.ckpt", tmp_path / "PWNED"
    _malicious_sharded(folder, marker, where)
    code = ("import sys\nfrom scalelab.training.checkpoint import read_sharded, CheckpointError\n"
            "try:\n    read_sharded(sys.argv[1])\nexcept CheckpointError as e:\n"
            "    print(e); sys.exit(2)\n")
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    r = subprocess.run([sys.executable, "-c", code, str(folder)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert not marker.exists(), "the checkpoint's payload ran"
    assert r.returncode == 2, r.stdout + r.stderr[-2000:]
    assert "not a usable checkpoint" in r.stdout and "weights_only" not in r.stdout
    # the CLI that consolidates for sample/export refuses it the same way
    s = subprocess.run([sys.executable, "-m", "scalelab.cli.sample", str(folder)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert not marker.exists() and s.returncode == 2 and "Traceback" not in s.stderr, s.stderr[-2000:]


def test_a_genuine_sharded_folder_still_reads(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "last.ckpt"
    opt = {"state": {0: {"step": torch.tensor(2.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    dcp.save({"model": {"w": torch.arange(4.0)}, "optimizer_0": opt}, checkpoint_id=str(folder),
             no_dist=True)
    torch.save({"global_step": 3}, folder / "meta.pt")
    assert verify(folder) is None
    ck = read_sharded(folder)
    assert torch.equal(ck["state_dict"]["w"], torch.arange(4.0)) and ck["global_step"] == 3
    (got,) = ck["optimizer_states"]  # non-tensor items came through the weights_only planner
    assert got["param_groups"] == [{"lr": 0.1, "params": [0]}]
    assert torch.equal(got["state"]["0"]["step"], torch.tensor(2.0))  # DCP keys are strings


def test_every_torch_load_in_the_package_passes_weights_only_true() -> None:
    """Explicit weights_only=True is what TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD cannot override."""
    import ast

    src = Path(__file__).resolve().parents[2] / "src" / "scalelab"
    bad = []
    for f in src.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "load" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"):
                kw = {k.arg: k.value for k in node.keywords}
                ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
                if not ok:
                    bad.append(f"{f.relative_to(src)}:{node.lineno}")
    assert not bad, f"torch.load without weights_only=True: {bad}"


def test_torch_floor_covers_the_apis_the_code_uses() -> None:
    import re

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=(\d+)\.(\d+)', pyproject)
    assert floor, "pyproject.toml pins no torch floor"
    assert (int(floor[1]), int(floor[2])) >= (2, 6), "get_total_norm needs torch 2.6, enable_gqa 2.5"
