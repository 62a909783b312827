"""Speed levers for the plain-loop step, side by side in one process, interleaved.

Each variant trains scalelab's ``Transformer`` on the same fixed batches of a bench preset with
the experiment's AdamW settings; the variants step in turn (A B C A B C ...), so a change of
load on a shared machine hits them alike. Reported: median ms per step (wall and CPU), the
ratio to the eager fused-AdamW baseline, and each variant's cold start (first step, which for
``torch.compile`` includes compiling).

    python -m benchmarks train --levers [--presets shakespeare_char] [--loop-steps 40]

Variants: eager + fused AdamW (baseline, the platform default on CPU), eager + foreach AdamW,
``torch.compile`` + fused AdamW, and bf16 autocast, eager and compiled, only where the CPU has
native bf16 (``scalelab.runtime.cpu_has_native_bf16``; elsewhere they are listed as skipped,
never run).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

import torch


def variants() -> dict[str, dict[str, Any]]:
    from scalelab.runtime import cpu_has_native_bf16

    out: dict[str, dict[str, Any]] = {
        "eager/fused": {"fused": True},
        "eager/foreach": {"fused": False},
        "compile/fused": {"fused": True, "compile": True},
    }
    if cpu_has_native_bf16():
        out["eager/fused/bf16"] = {"fused": True, "amp": torch.bfloat16}
        out["compile/fused/bf16"] = {"fused": True, "amp": torch.bfloat16, "compile": True}
    return out


def bench_levers(name: str, overrides: list[str], steps: int, log: Any = print) -> dict[str, Any]:
    from benchmarks.bench_train import PlainLoop, prepare_preset
    from scalelab.model import Transformer

    prep = prepare_preset(overrides)
    loops: dict[str, PlainLoop] = {}
    cold: dict[str, float] = {}
    for label, v in variants().items():
        torch.manual_seed(0)
        p = {**prep, "spec": replace(prep["spec"], optim=replace(prep["spec"].optim, fused=v["fused"]))}
        loops[label] = PlainLoop(Transformer(prep["model_cfg"]), p, "model", amp=v.get("amp"),
                                 compile=v.get("compile", False))
        t0 = time.perf_counter()
        loops[label].step()  # cold start: first step (compile happens here)
        cold[label] = time.perf_counter() - t0
    from benchmarks.bench_train import run_interleaved

    times = run_interleaved(loops, steps, skip=3)
    wall = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    base = "eager/fused"
    res: dict[str, Any] = {"preset": name, "steps": steps, "variants": {}}
    for k in loops:
        res["variants"][k] = {"ms_wall": 1000 * wall[k], "ms_cpu": 1000 * cpu[k],
                              "speedup_wall": wall[base] / wall[k], "speedup_cpu": cpu[base] / cpu[k],
                              "cold_start_s": cold[k]}
    if "eager/fused/bf16" not in loops:
        res["skipped"] = ["bf16 autocast, eager and compiled: no native bf16 on this CPU (avx512_bf16/amx_bf16)"]
    for k, v in res["variants"].items():
        log(f"  levers {name} {k:<18} {v['ms_wall']:7.1f} ms wall {v['ms_cpu']:7.1f} ms cpu  "
            f"x{v['speedup_wall']:.2f} wall x{v['speedup_cpu']:.2f} cpu  first step {v['cold_start_s']:.1f} s")
    for s in res.get("skipped", []):
        log(f"  levers {name} skipped: {s}")
    return res
