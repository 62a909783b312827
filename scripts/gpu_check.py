#!/usr/bin/env python
"""`make gpu-check`: a real 1-GPU FSDP round trip through the real CLI, in well under 5 minutes.

Steps (each prints PASS/FAIL; the script exits 1 if any fails):
  1. train    scalelab-train trainer=fsdp trainer.devices=1 (bf16-mixed, per-block wrapping,
              sharded checkpoints) on Tiny Shakespeare, a small GPT, a few dozen steps
  2. sharded  checkpoints/last.ckpt is a torch.distributed.checkpoint folder
  3. resume   resume=true continues the same run (same MLflow run id) to a later step
  4. consolidate  python -m scalelab.cli.consolidate -> one .ckpt loadable with weights_only=True
  5. sample/export  scalelab-sample and scalelab-export read the consolidated checkpoint

Without a CUDA device it prints "SKIPPED: no CUDA device" and exits 0. ``--cpu-smoke`` runs the
same commands with trainer=cpu instead (checks the plumbing; the FSDP-only steps are skipped).
Everything it writes goes to a temporary folder (or --workdir), with its own SQLite MLflow store.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def data_file() -> Path:
    d = Path(os.environ.get("SCALELAB_SHARED_DATA") or ROOT.parent / "shared" / "data")
    return d / "tinyshakespeare.txt"


class Check:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def step(self, name: str, ok: bool, detail: str = "") -> bool:
        print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
        if not ok:
            self.failed.append(name)
        return ok


def run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float]:
    t = time.time()
    with log.open("w") as fh:
        print("$ " + " ".join(cmd), flush=True)
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    if rc != 0:
        print("\n".join(log.read_text().splitlines()[-30:]))
    return rc, time.time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=None, help="keep outputs here (default: a temp folder)")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of the first leg")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="no GPU: same commands with trainer=cpu (checks the plumbing only; "
                         "the FSDP-only steps are skipped)")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("SKIPPED: no CUDA device (make gpu-check needs one GPU; nothing was run)")
        return 0
    fsdp = not args.cpu_smoke
    device = torch.cuda.get_device_name(0) if fsdp else "CPU smoke test (trainer=cpu, no FSDP)"
    print(f"device: {device}  torch {torch.__version__}", flush=True)
    if not data_file().is_file():
        print(f"FAIL: {data_file()} not found; set SCALELAB_SHARED_DATA")
        return 1

    work = Path(args.workdir or tempfile.mkdtemp(prefix="scalelab_gpu_check_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_dir = work / "run"
    chk = Check()
    t0 = time.time()
    steps1, steps2 = args.steps, args.steps + max(2, args.steps // 2)
    base = [
        PY, "-m", "scalelab.cli.train",
        *(["trainer=fsdp", "trainer.devices=1", "trainer.precision=bf16-mixed"] if fsdp
          else ["trainer=cpu"]),
        "trainer.enable_progress_bar=false",
        # the CPU smoke checks the plumbing only: a model a CPU steps through quickly
        "model=nano", f"model.d_model={256 if fsdp else 64}", "model.n_layers=4", "model.n_heads=4",
        "model.max_seq_len=128", "data=shakespeare", f"data.path={data_file()}", "tokenizer=char",
        "train.global_batch_size=32", f"train.val_every={steps1 // 2}", "train.val_batches=4",
        "run_name=gpu_check", f"paths.output_dir={out_dir}", f"paths.data_dir={work / 'data_cache'}",
        f"logger.tracking_uri=sqlite:///{work / 'mlflow.db'}",
        f"logger.artifact_root={work / 'mlartifacts'}",
    ]

    # 1. train
    rc, dt = run([*base, f"train.max_steps={steps1}"], work / "train.log", 240)
    summary = out_dir / "summary.json"
    s1 = json.loads(summary.read_text()) if summary.is_file() else {}
    chk.step("train (FSDP, 1 GPU, bf16-mixed)" if fsdp else "train (trainer=cpu smoke)", rc == 0 and s1.get("metrics", {}).get("final/steps") == steps1,
             f"rc={rc}, {dt:.0f}s, val_loss={s1.get('final_val_loss')}, "
             f"tokens/s={s1.get('metrics', {}).get('final/tokens_per_s')}")

    # 2. the checkpoint is sharded (one folder, torch.distributed.checkpoint)
    from scalelab.training.checkpoint import is_sharded_checkpoint

    last = out_dir / "checkpoints" / "last.ckpt"
    if fsdp:
        chk.step("sharded checkpoint", is_sharded_checkpoint(last),
                 f"{last} -> {sorted(p.name for p in last.iterdir()) if last.is_dir() else 'not a folder'}")

    # 3. resume: same MLflow run, continues to steps2
    rc, dt = run([*base, f"train.max_steps={steps2}", "resume=true", "train.resume_schedule=continue"],
                 work / "resume.log", 240)
    s2 = json.loads(summary.read_text()) if summary.is_file() else {}
    chk.step("resume from the sharded checkpoint" if fsdp else "resume from last.ckpt",
             rc == 0 and s2.get("metrics", {}).get("final/steps") == steps2
             and s2.get("run_id") == s1.get("run_id") and s2.get("resumed_from") is not None,
             f"rc={rc}, {dt:.0f}s, steps={s2.get('metrics', {}).get('final/steps')}, "
             f"run_id {s1.get('run_id')} -> {s2.get('run_id')}")

    # 4. consolidate -> plain checkpoint, weights_only load
    full = work / "last.full.ckpt"
    if fsdp:
        rc, dt = run([PY, "-m", "scalelab.cli.consolidate", str(last), "-o", str(full)],
                     work / "consolidate.log", 120)
    else:  # nothing to consolidate: the plain checkpoint stands in for the consolidated one
        import shutil

        rc, full = 0, Path(shutil.copy(last, full))
    ok, detail = False, f"rc={rc}"
    if rc == 0 and full.is_file():
        ck = torch.load(full, map_location="cpu", weights_only=True)
        n = sum(v.numel() for v in ck["state_dict"].values())
        ok = ck.get("global_step") == steps2 and n > 0
        detail = f"{full.stat().st_size / 1e6:.1f} MB, {n:,} weights, global_step={ck.get('global_step')}"
    chk.step("consolidate sharded -> plain (weights_only=True)" if fsdp
             else "plain checkpoint loads with weights_only=True", ok, detail)

    # 5. sample and export from the consolidated checkpoint with the real CLIs
    rc, dt = run([PY, "-m", "scalelab.cli.sample", str(full), "--max-new-tokens", "100"],
                 work / "sample.log", 120)
    text = (work / "sample.log").read_text() if (work / "sample.log").is_file() else ""
    chk.step("sample from the consolidated checkpoint", rc == 0 and len(text.strip()) > 0,
             f"rc={rc}: {text.strip()[-120:]!r}")
    rc, dt = run([PY, "-m", "scalelab.cli.export", str(full), "--out", str(work / "export")],
                 work / "export.log", 120)
    chk.step("export from the consolidated checkpoint",
             rc == 0 and any((work / "export").glob("*")), f"rc={rc}")

    print(f"total {time.time() - t0:.0f}s, outputs in {work}")
    if chk.failed:
        print(f"FAILED: {', '.join(chk.failed)}")
        return 1
    print("ALL PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
