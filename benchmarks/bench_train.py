"""Training throughput: a hand-written loop vs scalelab's Transformer vs the full scalelab-train.

Three sides, interleaved (A B C A B C ...), medians and ratios:

1. ref      a minimal transformer (benchmarks/reference_gpt.py) in a plain loop, same batches,
            same AdamW settings and threads (decoders and the encoder only);
2. model    scalelab's ``Transformer`` in that same plain loop (model efficiency); 1 and 2
            alternate step by step, so load changes on a shared machine hit both alike;
3. platform ``scalelab-train`` as a subprocess: Hydra, Lightning, MLflow (a temp SQLite store),
            callbacks, validation, samples and checkpoints at the experiment's defaults.

Plus ``threads`` (the automatic thread rule vs hand-picked settings, idle and loaded) and
``memory`` (activation checkpointing: activation memory saved, loss/grad parity).

    python -m benchmarks train                   # quick (< 3 min): 2 presets, 1 round
    python -m benchmarks train --full            # every preset, 3 rounds, + threads
    python -m benchmarks train --json out.json   # also write the results
    python -m benchmarks train --compare old.json new.json
    python -m benchmarks train --gpu             # GPT-2 124M / Llama 124M, bf16, compile

Exits 1 when a ratio misses its target (or, with --compare, when a metric regressed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.lockstep import Pipes, take_turns
from scalelab.runtime import thread_plan

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = Path(os.environ.get("SCALELAB_SHAKESPEARE", "/work/shared/data/tinyshakespeare.txt"))
TARGETS = {
    "model/ref": 1.0,  # (2)/(1): the Transformer is as fast as a hand-written one
    "platform/model": 0.97,  # (3)/(2): the platform's steady state vs the same module in a loop
    "time_to_first_step_s": 8.0,  # at most, with the data cache built
    "overhead_share": 0.05,  # validation, samples, checkpoints: at most this share of wall time
    "gpu_mfu": 0.45,  # steady state, GPU mode, on an H100/H200-class GPU
}

PRESETS: dict[str, list[str]] = {
    "shakespeare_char": ["+experiment=shakespeare_char"]
    + ([f"data.path={SHAKESPEARE}"] if SHAKESPEARE.is_file() else []),
    "pystdlib_small": [],  # the default experiment
    "llama": ["+experiment=llama_tiny_pystdlib"],  # RoPE, RMSNorm, SwiGLU, GQA
    "encoder": ["+experiment=bert_mlm_small"],  # MLM
    "encdec": ["+experiment=reverse_seq2seq"],
    # One point of `scalelab-sweep sweep=cpu_medium` as the sweep runs it: cpu_medium's
    # train_overrides, then what scaling/point_config.py's point_overrides sets for C4e10-N5k in the
    # latest study (docs/img/cpu_medium_hs: d 12, 2 layers, 7 x 64 tokens a step, its tuned lr,
    # 1,842 steps logged every 19, 4 validations of 2 batches, no progress bar, no best
    # checkpoint). A sweep's steps are this small, so fixed per-step work decides its wall time.
    "sweep_point": ["model=gpt2_tiny", "data=pystdlib", "data.val_fraction=0.25", "tokenizer=char",
                    "tokenizer.char_min_count=1000", "model.max_seq_len=64",
                    "callbacks.sample.enabled=false", "logger.log_checkpoint=false",
                    "model.d_model=12", "model.n_layers=2", "model.n_heads=3",
                    "train.global_batch_size=7", "optim.lr=0.020447", "optim.warmup_steps=12",
                    "optim.beta2=0.95", "optim.min_lr_ratio=0.1", "train.max_steps=1842",
                    "train.val_every=460", "train.val_batches=2", "trainer.log_every_n_steps=19",
                    "trainer.enable_progress_bar=false", "callbacks.checkpoint.save_best=false"],
}
# Threads a preset runs with where not the bench's rule for one process: a sweep gives each of
# its parallel points cores/jobs threads, which is 1 for the CPU sweep presets (a job a core).
PRESET_THREADS: dict[str, int] = {"sweep_point": 1}
# r50k_base holds GPT-2's ranks under tiktoken's one-file format, which an offline machine can be
# given (docs/performance.md). The 3 special ids scalelab adds make its vocabulary 50,260; the
# model's is padded to 50,304 (a multiple of 128, as nanoGPT's), since unaligned output rows slow
# the largest matmul. Batch 32 x 1024. benchmarks/gpu_levers.py measures both choices.
GPU_COMMON = ["trainer=gpu", "trainer.precision=bf16-mixed", "train.compile=true",
              "optim.fused=true", "train.block_size=1024", "train.global_batch_size=32",
              "tokenizer=r50k_base", "model.vocab_size=50304", "data=pystdlib"]
GPU_PRESETS: dict[str, list[str]] = {
    "gpt2_124m": ["model=gpt2", *GPU_COMMON],
    # tied embeddings (as Llama 3.2 1B) and d_ff 2432 (19 x 128) bring it to GPT-2's size: 124.7M
    "llama_124m": ["model=llama_tiny", "model.d_model=768", "model.n_layers=12", "model.n_heads=12",
                   "model.n_kv_heads=4", "model.max_seq_len=1024", "model.tie_embeddings=true",
                   "model.d_ff=2432", *GPU_COMMON],
}
# optimizer steps per lockstep turn on a GPU (benchmarks/phase_timer.py): each turn ends with a
# synchronize, and with one after every step neither side's host work can overlap the GPU's, as
# it does in a real run (turns of one step read (3)/(2) 0.96 on an H200)
GPU_TURN_STEPS = 10
MODES = {  # presets, rounds, plain-loop steps per round, platform steps per run
    # quick: one round per preset (a platform run costs ~20 s of start-up and exit on top of its
    # steps: two rounds took 237 s); 110 platform steps (shakespeare_char warms up for 100)
    # with one mid-run validation at 55 timed, 30 interleaved plain-loop steps
    "quick": (["shakespeare_char", "pystdlib_small"], 1, 30, 110),
    "full": (list(PRESETS), 3, 60, 300),
    "gpu": (list(GPU_PRESETS), 2, 10, 200),  # plain-loop turns of GPU_TURN_STEPS steps
}


# --- config and data, as scalelab-train builds them ------------------------------------------
def compose(overrides: list[str]) -> Any:
    from scalelab.config.compose import compose as compose_config

    return compose_config("train", overrides)


def prepare_preset(overrides: list[str], n_batches: int = 16) -> dict[str, Any]:
    """Model config, optimizer config, objective and a fixed list of train batches."""
    from scalelab.config.spec import build_spec
    from scalelab.data.bundle import build_data_bundle

    cfg = compose(overrides)
    cfg.paths.data_dir = str(data_dir())
    spec = build_spec(cfg)
    data = build_data_bundle(spec.objective, spec.data, spec.tokenizer,
                             micro_batch=spec.batch.micro_batch, block_size=spec.block_size,
                             seed=spec.seed, val_batches=int(spec.train.val_batches),
                             cache_dir=data_dir(), progress=False)
    it = iter(data.datamodule.train_dataloader())
    batches = [next(it) for _ in range(n_batches)]
    return {"cfg": cfg, "spec": spec, "model_cfg": spec.with_vocab(data.vocab_size),
            "batches": batches, "datamodule": data.datamodule}


def data_dir() -> Path:
    return Path(os.environ.get("SCALELAB_BENCH_DATA", ROOT / "data_cache"))


# --- the plain loop (sides 1 and 2) -----------------------------------------------------------
def loss_fn(side: str, objective: str) -> Any:
    def loss(model: torch.nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        if objective == "seq2seq":
            logits = model(b["tgt_in"], attention_mask=b.get("tgt_mask"), src_ids=b["src_ids"],
                           src_mask=b.get("src_mask"))
        elif objective == "mlm" and side == "model":
            logits = model(b["input_ids"], attention_mask=b.get("attention_mask"))
        else:
            logits = model(b["input_ids"])
        return F.cross_entropy(logits.flatten(0, 1).float(), b["labels"].flatten(), ignore_index=-100)

    return loss


class PlainLoop:
    """model + AdamW (the run's decay groups, lr/betas/eps, fused where torch has it) +
    clipping, stepping over fixed batches; the loop a hand-written script would have."""

    def __init__(self, model: torch.nn.Module, prep: dict[str, Any], side: str, device: str = "cpu",
                 amp: torch.dtype | None = None, compile: bool = False) -> None:
        from scalelab.training.optim import fused_available, param_groups

        o = prep["spec"].optim
        self.model = model.to(device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        # the run's own split (matrices decay; embeddings only with optim.decay_embeddings): the
        # same optimizer settings on every side, whichever model it steps
        groups, _ = param_groups(self.model, o.weight_decay, o.decay_embeddings)
        fused = fused_available(params) if o.fused is None else bool(o.fused)
        self.opt = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                     **({"fused": True} if fused else {}))
        self.clip = float(o.grad_clip or 0.0)
        self.batches = [{k: v.to(device) for k, v in b.items()} for b in prep["batches"]]
        self.key = "tgt_in" if prep["spec"].objective == "seq2seq" else "input_ids"
        self.tokens = self.last_tokens = self.batches[0][self.key].numel()
        loss = loss_fn(side, prep["spec"].objective)
        # compiled with its loss, as nanoGPT's forward returns it: the cross-entropy fuses with
        # the logits' upcast (the platform compiles the same pair)
        self.loss = torch.compile(partial(loss, self.model)) if compile else partial(loss, self.model)
        self.device, self.amp, self.i = device, amp, 0

    def step(self) -> float:
        b = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.last_tokens = b[self.key].numel()
        with torch.autocast(self.device, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            loss = self.loss(b)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def timed_step(self, steps: int = 1) -> tuple[float, float]:
        """(wall seconds, CPU seconds of this process) of ``steps`` steps, synchronized at both
        ends only: on a GPU the host's work for a step overlaps the previous step's kernels."""
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.step()
        sync()
        return time.perf_counter() - t0, time.process_time() - c0

    def timed_turn(self, steps: int = 1) -> tuple[float, float, int]:
        """(wall s, CPU s, tokens) of the plain loop's turn against a platform run."""
        wall, cpu = self.timed_step(steps)
        return wall, cpu, self.last_tokens * steps


def run_interleaved(loops: dict[str, PlainLoop], steps: int, skip: int = 3,
                    per_turn: int = 1) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds per step of each loop, alternating turns of ``per_turn`` steps each
    (A B A B ...), so a change in the machine's load hits both sides alike; ``steps`` turns are
    timed after ``skip`` turns of warm-up."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in loops}
    for k in range(steps + skip):
        for side, loop in loops.items():
            wall, cpu = loop.timed_step(per_turn)
            if k >= skip:
                times[side].append((wall / per_turn, cpu / per_turn))
    return times


def window_metric(db: Path, run_id: str, key: str) -> float | None:
    """Median of a metric's logged values in a run (read straight from the SQLite store)."""
    import sqlite3

    with sqlite3.connect(db) as con:
        vals = [v for (v,) in con.execute(
            "SELECT value FROM metrics WHERE run_uuid = ? AND key = ?", (run_id, key))]
    return statistics.median(vals) if vals else None


# --- the platform (side 3) --------------------------------------------------------------------
def create_store(workdir: Path) -> None:
    """Create the bench's MLflow SQLite store before any timed run: a new store runs MLflow's
    schema migrations (~2-3 s), a one-off cost of a user's first run that would otherwise land
    in the first preset's time to first step (the target counts with caches built)."""
    code = ("import sys; from mlflow.tracking import MlflowClient; "
            "MlflowClient(sys.argv[1]).search_experiments()")
    subprocess.run([sys.executable, "-c", code, f"sqlite:///{workdir}/mlruns.db"], check=True,
                   capture_output=True, cwd=ROOT)


def platform_cmd(overrides: list[str], out: Path, workdir: Path) -> list[str]:
    """``scalelab-train`` with its run folder at ``out``, the bench's token cache, and the MLflow
    store and artifacts in ``workdir``."""
    return [sys.executable, "-m", "scalelab.cli.train", *overrides,
            f"paths.output_dir={out}", f"paths.data_dir={data_dir()}",
            f"logger.tracking_uri=sqlite:///{workdir}/mlruns.db",
            f"logger.artifact_root={workdir}/mlartifacts"]


def run_platform(overrides: list[str], steps: int | None, workdir: Path, threads: int,
                 gpu: bool = False, partner: PlainLoop | None = None, turn: int = 1) -> dict[str, Any]:
    """One ``scalelab-train`` subprocess; ``steps`` None keeps the experiment's run length.
    With a ``partner`` plain loop, the two take turns step by step (benchmarks/lockstep.py) and
    the steady state of both sides comes from those turns of ``turn`` steps."""
    if not (workdir / "mlruns.db").exists():  # before the clock starts
        create_store(workdir)
    stamp = time.time_ns()
    out, phases, log_path = (workdir / f"{k}_{stamp}" for k in ("run", "phases", "log"))
    pipes = Pipes.open() if partner is not None else None
    timer = f"path: '{phases}'" + (f", lockstep: '{pipes.callback_arg}', every: {turn}" if pipes else "")
    args = platform_cmd([*overrides,
                         "+callbacks.bench_phases={_target_: benchmarks.phase_timer.PhaseTimer, " + timer + "}",
                         *([f"train.max_steps={steps}"] if steps else [])], out, workdir)
    if not gpu:
        args.append(f"train.num_threads={threads}")
    t0, ru0 = time.time(), child_cpu()
    turns: list[tuple[float, float, int]] = []
    with log_path.open("w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                pass_fds=pipes.run_ends if pipes else ())
        try:
            if pipes is not None and partner is not None:
                pipes.started()
                turns = take_turns(proc, pipes, partial(partner.timed_turn, turn))
        finally:
            proc.wait()
    t_end, cpu_total = time.time(), child_cpu() - ru0
    if proc.returncode != 0:
        raise RuntimeError(f"scalelab-train failed ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    m = s["metrics"]
    ttfs = m.get("final/time_to_first_step")
    res = {"tokens_per_s": float(m["final/tokens_per_s"]), "wall_s": t_end - t0,
           "time_to_first_step_s": ttfs, "mfu": m.get("final/mfu"), "val_loss": s.get("final_val_loss"),
           "steps": m.get("final/steps"), "cpu_total_s": cpu_total,
           **phase_times(phases, t_end, cpu_total)}
    if turns:  # the run's own rates and windows include its waits: the turns replace them
        res.update(lockstep_rates(json.loads(phases.read_text()), turns, steps_per_turn=turn))
        res["wall_s"] -= res["paused_s"]  # the run's own wall: without its waits for the bench
    elif s.get("run_id"):
        res["tokens_per_cpu_s"] = window_metric(workdir / "mlruns.db", s["run_id"], "tokens_per_cpu_sec")
    # time the steps alone would take at the steady rate: the rest is start-up, validation,
    # samples, checkpoints and exit
    train_s = ((res["steps"] or 0) * res["step_s"] if turns
               else float(m["final/tokens_seen"]) / res["tokens_per_s"])
    res["overhead_share"] = max(0.0, (res["wall_s"] - (ttfs or 0.0) - train_s) / res["wall_s"])
    return res


def lockstep_rates(phases: dict[str, Any], turns: list[tuple[float, float, int]],
                   warmup: int = 2, steps_per_turn: int = 1) -> dict[str, Any]:
    """Steady-state tokens/s and tokens/CPU-s of both sides from their turns. The run's cycles
    that held a validation are left out (the overhead figures count those); the CPU the run's
    own threads used while it waited is charged to the run."""
    cycles = phases["cycles"][warmup:]
    steady = [c for c in cycles if not c[3]]
    plain = turns[warmup:]
    pause_cpu = sum(c for _, c in phases["pauses"])
    run_cpu = sum(c[1] for c in steady) + pause_cpu * len(steady) / max(1, len(cycles))
    tokens = sum(c[2] for c in steady)
    return {"tokens_per_s": tokens / sum(c[0] for c in steady),
            "tokens_per_cpu_s": tokens / run_cpu,
            "step_s": statistics.mean(c[0] for c in steady) / steps_per_turn,
            "step_cpu_s": statistics.mean(c[1] for c in steady) / steps_per_turn,
            "paused_s": sum(w for w, _ in phases["pauses"]),
            "background_cpu_share": pause_cpu / max(run_cpu, 1e-9),
            "partner_tokens_per_s": sum(t for *_, t in plain) / sum(w for w, _, _ in plain),
            "partner_tokens_per_cpu_s": sum(t for *_, t in plain) / sum(c for _, c, _ in plain),
            "turns": len(steady)}


def child_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def phase_times(path: Path, t_end: float, cpu_total: float | None = None) -> dict[str, Any]:
    """From benchmarks/phase_timer.py: median step, mean validation gap (validation + sample +
    checkpoints at that validation) and what followed fit (final val/sample/ckpt, upload, exit)."""
    if not path.is_file():
        return {}
    p = json.loads(path.read_text())
    steps = [w for w, _ in p["steps"][3:]] or [w for w, _ in p["steps"]]
    gaps = [w for w, _ in p["val_gaps"]]
    return {"step_s": statistics.median(steps) if steps else None,
            "val_event_s": statistics.mean(gaps) if gaps else None,
            "after_fit_s": t_end - p["fit_end_unix"],
            # the tracking process's CPU up to the first step is start-up, up to the end of fit
            # the run's logging; only what it uses after fit is end-of-run work (phase_timer.py)
            "first_step_cpu_s": _plus(p.get("first_step_cpu"), p.get("first_step_helpers_cpu")),
            "helpers_train_cpu_s": _minus(p.get("fit_end_helpers_cpu"), p.get("first_step_helpers_cpu")),
            # the same in CPU seconds of the run's process: robust to other jobs' load
            "step_cpu_s": statistics.median(c for _, c in p["steps"][3:] or p["steps"]),
            "val_event_cpu_s": statistics.mean(c for _, c in p["val_gaps"]) if gaps else None,
            "after_fit_cpu_s": None if cpu_total is None
            else cpu_total - p["fit_end_cpu"] - (p.get("fit_end_helpers_cpu") or 0.0)}


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None else a + (b or 0.0)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def projected_overhead(plat: dict[str, Any], max_steps: int, val_every: int,
                       cpu: bool = False) -> float | None:
    """Share of a default-length run's wall spent validating, sampling and checkpointing: the
    measured cost of one validation event times the validations the defaults schedule, plus
    the end of the run (final validation, sample, checkpoint, upload), over the whole run."""
    keys = (("step_cpu_s", "val_event_cpu_s", "after_fit_cpu_s", "first_step_cpu_s") if cpu
            else ("step_s", "val_event_s", "after_fit_s", "time_to_first_step_s"))
    step, val, end, first = (plat.get(k) for k in keys)
    if step is None or val is None or end is None:
        return None
    n_val = (max_steps - 1) // val_every  # in-loop; the end of the run is after_fit
    extra = n_val * val + end
    return extra / ((first or 0.0) + max_steps * step + extra)


# --- one preset, three sides interleaved -------------------------------------------------------
def bench_preset(name: str, overrides: list[str], rounds: int, loop_steps: int,
                 platform_steps: int, workdir: Path, threads: int, gpu: bool = False,
                 log: Any = print) -> dict[str, Any]:
    from benchmarks.reference_gpt import ReferenceLM
    from scalelab.model import Transformer

    prep = prepare_preset(overrides)
    mcfg = prep["model_cfg"]
    device = "cuda" if gpu else "cpu"
    amp = torch.bfloat16 if gpu else None
    loops: dict[str, PlainLoop] = {}
    torch.manual_seed(0)
    if mcfg.arch != "encoder_decoder":  # an encoder-decoder has no hand-written counterpart
        loops["ref"] = PlainLoop(ReferenceLM(mcfg), prep, "ref", device, amp, compile=gpu)
    loops["model"] = PlainLoop(Transformer(mcfg), prep, "model", device, amp, compile=gpu)
    step_times: dict[str, list[float]] = {k: [] for k in loops}
    step_cpu: dict[str, list[float]] = {k: [] for k in loops}
    plat: list[dict[str, Any]] = []
    turn = GPU_TURN_STEPS if gpu else 1
    for r in range(rounds):
        for side, times in run_interleaved(loops, loop_steps, per_turn=turn).items():
            step_times[side].append(statistics.median(t for t, _ in times))
            step_cpu[side].append(statistics.median(c for _, c in times))
        # one validation mid-run as well as the last step's, so its cost is measured; on a CPU in
        # fp32 like the plain loops (trainer.precision=auto would take bf16 on an AMX CPU)
        equal = [] if gpu else ["trainer.precision=32-true"]
        plat.append(run_platform([*overrides, *equal, f"train.val_every={max(1, platform_steps // 2)}"],
                                 platform_steps, workdir, threads, gpu, partner=loops["model"], turn=turn))
        log(f"  {name} round {r + 1}/{rounds} ({threads} thread{'s' * (threads > 1)}): " + ", ".join(
            f"{s} {loop.tokens / step_times[s][-1]:,.0f} tok/s" for s, loop in loops.items())
            + "; per CPU-second: " + ", ".join(
                f"{s} {loop.tokens / step_cpu[s][-1]:,.0f}" for s, loop in loops.items())
            + f"; in {plat[-1]['turns']} turns: platform {plat[-1]['tokens_per_s']:,.0f} vs model "
            f"{plat[-1]['partner_tokens_per_s']:,.0f} tok/s "
            f"({plat[-1]['tokens_per_s'] / plat[-1]['partner_tokens_per_s']:.2f}); first step "
            f"{fmt(plat[-1]['time_to_first_step_s'], '.1f')} s")
    res: dict[str, Any] = {"preset": name, "tokens_per_step": loops["model"].tokens,
                           "params": mcfg.n_params(), "threads": threads}
    for side, loop in loops.items():
        res[f"{side}_tokens_per_s"] = loop.tokens / statistics.median(step_times[side])
        res[f"{side}_tokens_per_cpu_s"] = loop.tokens / statistics.median(step_cpu[side])
    for key in ("tokens_per_s", "tokens_per_cpu_s", "wall_s", "time_to_first_step_s",
                "overhead_share", "mfu", "step_s", "val_event_s", "after_fit_s",
                "first_step_cpu_s", "step_cpu_s", "val_event_cpu_s", "after_fit_cpu_s", "helpers_train_cpu_s",
                "partner_tokens_per_s", "partner_tokens_per_cpu_s", "background_cpu_share", "turns"):
        vals = [p[key] for p in plat if p.get(key) is not None]
        res[f"platform_{key}"] = statistics.median(vals) if vals else None
    res["platform_steps"] = platform_steps
    spec = prep["spec"]  # the experiment's own run length and validation interval
    res["default_run"] = {"max_steps": spec.max_steps, "val_every": spec.val_every}
    plat_med = {k[len("platform_"):]: v for k, v in res.items() if k.startswith("platform_")}
    res["platform_overhead_default_run"] = projected_overhead(plat_med, spec.max_steps, spec.val_every)
    res["platform_overhead_default_run_cpu"] = projected_overhead(
        plat_med, spec.max_steps, spec.val_every, cpu=True)
    if "ref" in loops:
        res["ref_wall_s"] = platform_steps * statistics.median(step_times["ref"])  # no start-up
        res["model/ref"] = res["model_tokens_per_s"] / res["ref_tokens_per_s"]
        res["model/ref_cpu"] = res["model_tokens_per_cpu_s"] / res["ref_tokens_per_cpu_s"]
        res["platform_wall/ref_wall"] = res["platform_wall_s"] / res["ref_wall_s"]
    if gpu:
        res.update(gpu_mfu(res, mcfg.flops_per_token(seq_len=prep["spec"].block_size), list(loops)))
    # (3)/(2) per round from the turns the two sides took, then the median over rounds
    res["platform/model"] = statistics.median(p["tokens_per_s"] / p["partner_tokens_per_s"] for p in plat)
    res["platform/model_cpu"] = statistics.median(
        p["tokens_per_cpu_s"] / p["partner_tokens_per_cpu_s"] for p in plat)
    return res


def gpu_mfu(res: dict[str, Any], flops_per_token: int, sides: list[str]) -> dict[str, Any]:
    """Steady-state MFU of each side against the GPU's bf16 peak (scalelab/training/perf.py).
    The run's own ``final/mfu`` divides by its whole fit, compilation included."""
    from scalelab.training.perf import peak_flops

    peak = peak_flops("cuda", "bf16-mixed")
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "peak_flops": peak,
                           "flops_per_token": flops_per_token}
    for side in [*sides, "platform"]:
        out[f"{side}_mfu_steady"] = res[f"{side}_tokens_per_s"] * flops_per_token / peak
    return out


# --- threads: the automatic rule vs hand-picked settings --------------------------------------
CHILD = "--_loop-child"


def loop_child(steps: int) -> None:
    """Subprocess body: shakespeare_char-shaped Transformer, random tokens; prints ms/step."""
    from scalelab.model import ModelConfig, Transformer

    if "SCALELAB_BENCH_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["SCALELAB_BENCH_THREADS"]))
    else:
        torch.set_num_threads(thread_plan().threads)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=65, max_seq_len=64, d_model=128, n_layers=4, n_heads=4)
    m = Transformer(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x, y = torch.randint(0, 65, (12, 64)), torch.randint(0, 65, (12, 64))
    times = []
    for k in range(steps + 5):
        t0 = time.perf_counter()
        F.cross_entropy(m(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if k >= 5:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"ms": 1000 * statistics.median(times), "threads": torch.get_num_threads(),
                      "policy": os.environ.get("OMP_WAIT_POLICY", "")}))


def thread_settings() -> dict[str, dict[str, str]]:
    cores = thread_plan().cores
    out: dict[str, dict[str, str]] = {"auto": {}, "1t": {"SCALELAB_BENCH_THREADS": "1"}}
    for n in sorted({max(2, cores // 2), cores} - {1}):  # one thread never waits on another
        for policy in ("ACTIVE", "PASSIVE", ""):
            out[f"{n}t/{policy or 'default'}"] = {"SCALELAB_BENCH_THREADS": str(n),
                                                  "OMP_WAIT_POLICY": policy}
    return out


def _run_thread_child(extra: dict[str, str], steps: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "SCALELAB_OMP_AUTO")}
    env.update({k: v for k, v in extra.items() if v})
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_train", CHILD, str(steps)], env=env,
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def auto_twin(chosen: list[tuple[int, str]]) -> str | None:
    """The hand-picked setting "auto" ran as in every round (threads, wait policy), if any.
    One thread is "1t" whatever the policy: the policy says how idle team threads wait, and a
    single thread has none."""
    if len({(t, p if t > 1 else "") for t, p in chosen}) != 1:
        return None
    threads, policy = chosen[0]
    label = "1t" if threads == 1 else f"{threads}t/{policy or 'default'}"
    return label if label in thread_settings() else None


def auto_over_best(ms: dict[str, list[float]], twin: str | None) -> tuple[dict[str, float], float]:
    """(median ms per setting, best hand-picked / auto). When auto ran exactly as a hand-picked
    setting (its twin), both are one configuration timed twice as often: their samples are
    pooled, so the ratio is not the spread between two processes that do the same thing."""
    med = {k: statistics.median(v) for k, v in ms.items()}
    auto = med["auto"]
    if twin is not None:
        auto = med["auto"] = med[twin] = statistics.median(ms["auto"] + ms[twin])
    best = min(v for k, v in med.items() if k != "auto")
    return med, best / auto


def bench_threads(rounds: int, steps: int, log: Any = print) -> dict[str, Any]:
    """Each setting in its own process (the wait policy is read when libgomp loads), interleaved;
    idle as found, then with one busy-looping process competing for a core."""
    res: dict[str, Any] = {}
    for case in ("idle", "loaded"):
        hog = None
        if case == "loaded":
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            ms: dict[str, list[float]] = {}
            chosen: list[tuple[int, str]] = []
            for _ in range(rounds):
                for label, extra in thread_settings().items():
                    got = _run_thread_child(extra, steps)
                    ms.setdefault(label, []).append(got["ms"])
                    if label == "auto":
                        chosen.append((got["threads"], got["policy"]))
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        twin = auto_twin(chosen)
        raw, unpooled = auto_over_best(ms, None)
        med, ratio = auto_over_best(ms, twin)
        best = min((k for k in med if k != "auto"), key=med.get)
        res[case] = {"ms_per_step": raw, "auto_ran_as": twin or sorted(set(chosen)), "auto/best": ratio,
                     "auto/best_unpooled": unpooled, "load": os.getloadavg()[0]}
        log(f"  threads {case}: auto {med['auto']:.1f} ms (ran as {twin or chosen}), best hand-picked "
            f"{med[best]:.1f} ms ({best}), auto/best {ratio:.2f} (unpooled {unpooled:.2f})")
    return res


# --- memory: activation checkpointing -----------------------------------------------------------
def saved_activation_bytes(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes autograd keeps for backward during one forward (what checkpointing trades away)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if not isinstance(t, torch.nn.Parameter):
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
    return total, loss


def bench_memory(overrides: list[str] | None = None) -> dict[str, Any]:
    """Default experiment shape: activation bytes and loss/grad with and without checkpointing."""
    from scalelab.model import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=256, max_seq_len=256, d_model=256, n_layers=6, n_heads=8)
    torch.manual_seed(0)
    m = Transformer(cfg)
    x = torch.randint(0, 256, (8, 256))
    out: dict[str, Any] = {"shape": "d=256 L=6 T=256 B=8"}
    grads = {}
    for ac in (False, True):
        m.set_activation_checkpointing(ac)
        m.zero_grad(set_to_none=True)
        nbytes, loss = saved_activation_bytes(m, x)
        loss.backward()
        grads[ac] = (loss.item(), torch.cat([p.grad.flatten() for p in m.parameters()]))
        out["saved_bytes_" + ("checkpointed" if ac else "plain")] = nbytes
    out["activation_memory_ratio"] = out["saved_bytes_checkpointed"] / out["saved_bytes_plain"]
    out["max_grad_diff"] = float((grads[True][1] - grads[False][1]).abs().max())
    out["loss_diff"] = abs(grads[True][0] - grads[False][0])
    return out


# --- output -----------------------------------------------------------------------------------
def fmt(v: Any, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def table(results: list[dict[str, Any]]) -> str:
    head = (f"{'preset':<17}{'ref tok/s':>11}{'model tok/s':>12}{'platform':>10}{'(2)/(1)':>9}"
            f"{'(3)/(2)':>9}{'cpu 2/1':>9}{'cpu 3/2':>9}{'1st step':>9}{'1st cpu':>9}{'overhead':>9}{'ovh cpu':>9}{'wall 3/1':>9}")
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(
            f"{r['preset']:<17}{fmt(r.get('ref_tokens_per_s')):>11}{fmt(r['model_tokens_per_s']):>12}"
            f"{fmt(r['platform_tokens_per_s']):>10}{fmt(r.get('model/ref'), '.2f'):>9}"
            f"{fmt(r['platform/model'], '.2f'):>9}{fmt(r.get('model/ref_cpu'), '.2f'):>9}"
            f"{fmt(r.get('platform/model_cpu'), '.2f'):>9}"
            f"{fmt(r['platform_time_to_first_step_s'], '.1f'):>8}s"
            f"{fmt(r.get('platform_first_step_cpu_s'), '.1f'):>8}s"
            f"{fmt(None if overhead_of(r) is None else 100 * overhead_of(r), '.1f'):>8}%"
            f"{fmt(pct(r.get('platform_overhead_default_run_cpu')), '.1f'):>8}%"
            f"{fmt(r.get('platform_wall/ref_wall'), '.2f'):>9}")
    return "\n".join(rows)


def pct(v: float | None) -> float | None:
    return None if v is None else 100 * v


def overhead_of(r: dict[str, Any], busy: bool = False) -> float | None:
    """Validation/samples/checkpoints share: projected to the experiment's default run where
    measured (phase timer; in CPU seconds on a busy machine), else the short bench run's own
    (start-up and end included)."""
    o = r.get("platform_overhead_default_run_cpu") if busy else None
    o = o if o is not None else r.get("platform_overhead_default_run")
    return o if o is not None else r.get("platform_overhead_share")


def below(got: float, target: float) -> str:
    """``got`` to two decimals, or as many more as it takes not to round it up to the target
    it missed: 0.996 against 1.0 printed "1.00 < 1.0"."""
    places = next((d for d in range(2, 10) if round(got, d) < target), None)
    return repr(got) if places is None else f"{got:.{places}f}"


def misses(results: list[dict[str, Any]], threads: dict[str, Any] | None,
           busy: bool = False) -> list[str]:
    """Every figure off its target. ``busy``: other work shared the cores, so the throughput
    ratios are judged per CPU-second (``*_cpu``) where measured, not per wall second."""
    out = []
    for r in results:
        for key in ("model/ref", "platform/model"):
            got = r.get(f"{key}_cpu") if busy and r.get(f"{key}_cpu") is not None else r.get(key)
            if got is not None and got < TARGETS[key]:
                basis = " (per CPU-second)" if busy and r.get(f"{key}_cpu") is not None else ""
                out.append(f"{r['preset']}: {key} {below(got, TARGETS[key])} < {TARGETS[key]}{basis}")
        t = r.get("platform_time_to_first_step_s")
        if t is not None and t > TARGETS["time_to_first_step_s"]:
            out.append(f"{r['preset']}: time to first step {t:.1f} s > {TARGETS['time_to_first_step_s']} s")
        m = r.get("platform_mfu_steady")
        if m is not None and any(g in r["device"] for g in ("H100", "H200")) and m < TARGETS["gpu_mfu"]:
            out.append(f"{r['preset']}: steady-state MFU {m:.0%} < {TARGETS['gpu_mfu']:.0%} on {r['device']}")
        o = overhead_of(r, busy)
        if o is not None and o > TARGETS["overhead_share"]:
            out.append(f"{r['preset']}: overhead {o:.0%} of wall > {TARGETS['overhead_share']:.0%}")
    if threads:
        if threads["idle"]["auto/best"] < 0.95:
            out.append(f"threads idle: auto/best {threads['idle']['auto/best']:.2f} < 0.95")
        if threads["loaded"]["auto/best"] < 0.5:
            out.append(f"threads loaded: auto/best {threads['loaded']['auto/best']:.2f} < 0.5 (collapse)")
        arriving = threads.get("arriving")
        if arriving:
            from benchmarks.arriving_load import TARGET

            if arriving["auto/best"] < TARGET:
                out.append(f"threads, a job arriving mid-run: auto/best {arriving['auto/best']:.2f} < {TARGET}")
    return out


COMPARED = ("ref_tokens_per_s", "model_tokens_per_s", "platform_tokens_per_s", "model/ref",
            "platform/model", "model/ref_cpu", "platform/model_cpu")


def compare(old_path: str, new_path: str, tolerance: float) -> int:
    """new/old for every throughput figure both files have; 1 when one fell below 1 - tolerance."""
    old, new = (json.loads(Path(p).read_text()) for p in (old_path, new_path))
    old_by = {r["preset"]: r for r in old.get("presets", [])}
    worst, lines = [], [f"{'preset':<17}{'metric':<24}{'old':>12}{'new':>12}{'new/old':>9}"]
    for r in new.get("presets", []):
        o = old_by.get(r["preset"])
        if o is None:
            continue
        for key in COMPARED:
            if r.get(key) is None or o.get(key) is None or not o[key]:
                continue
            ratio = r[key] / o[key]
            flag = "  REGRESSED" if ratio < 1 - tolerance else ""
            lines.append(f"{r['preset']:<17}{key:<24}{o[key]:>12,.2f}{r[key]:>12,.2f}{ratio:>9.2f}{flag}")
            if flag:
                worst.append(f"{r['preset']} {key}")
    print("\n".join(lines))
    if worst:
        print(f"regressed by more than {tolerance:.0%}: {', '.join(worst)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every preset, 3 rounds, thread bench")
    ap.add_argument("--gpu", action="store_true", help="GPU presets (bf16, compile, fused AdamW)")
    ap.add_argument("--presets", help="comma-separated subset of presets")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--platform-steps", type=int)
    ap.add_argument("--loop-steps", type=int, help="plain-loop turns per round (GPU: 10 steps a turn)")
    ap.add_argument("--threads", action="store_true", help="run the thread bench (on in --full)")
    ap.add_argument("--no-train", action="store_true", help="skip the three-sided training bench")
    ap.add_argument("--to-loss", action="store_true",
                    help="time for the platform to reach the reference's val loss (target <= 0.8x)")
    ap.add_argument("--platform-override", action="append", default=[],
                    help="--to-loss: an override for the platform side only (a recipe change)")
    ap.add_argument("--ref-own-init", action="store_true",
                    help="--to-loss: the reference draws its own initial weights (default: the platform's)")
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")],
                    help="--to-loss: a seed a round, both sides (e.g. 1337,1,2 with --rounds 3)")
    ap.add_argument("--loss-tolerance", type=float,
                    help="--to-loss: how far above the reference's val loss counts as reached "
                         "(default 0.005; 0: strictly at most)")
    ap.add_argument("--levers", action="store_true",
                    help="eager vs foreach AdamW vs torch.compile (vs bf16 where native), interleaved")
    ap.add_argument("--memory", action="store_true", help="activation-checkpointing memory (on in --full)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--tolerance", type=float, default=0.05, help="--compare: allowed drop")
    argv = list(argv if argv is not None else [])
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # --to-loss: both sides
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.compare:
        return compare(*args.compare, args.tolerance)
    mode = "gpu" if args.gpu else "full" if args.full else "quick"
    if args.gpu and not torch.cuda.is_available():
        print("bench_train --gpu: no CUDA device here", file=sys.stderr)
        return 2
    presets, rounds, loop_steps, platform_steps = MODES[mode]
    presets = args.presets.split(",") if args.presets else presets
    rounds = args.rounds or rounds
    loop_steps, platform_steps = args.loop_steps or loop_steps, args.platform_steps or platform_steps
    plan = thread_plan()
    torch.set_num_threads(plan.threads)
    load = os.getloadavg()[0]  # the 1-minute average: it lags, so read it as a rough hint
    print(f"bench_train ({mode}): {plan.describe()}; torch {torch.__version__}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    table_of = GPU_PRESETS if args.gpu else PRESETS
    results, t0 = [], time.time()
    if args.to_loss or args.levers:
        return extra_modes(args, presets, rounds, loop_steps, plan.threads, extra, load, t0)
    with tempfile.TemporaryDirectory(prefix="scalelab-bench-") as tmp:
        if not args.no_train:
            for name in presets:
                n_threads = plan.threads if args.gpu else PRESET_THREADS.get(name, plan.threads)
                torch.set_num_threads(n_threads)  # the plain loops'; the run gets train.num_threads
                results.append(bench_preset(name, table_of[name], rounds, loop_steps,
                                            platform_steps, Path(tmp), n_threads, args.gpu,
                                            log=lambda s: print(s, flush=True)))
            torch.set_num_threads(plan.threads)
    threads = bench_threads(rounds, 40) if (args.threads or args.full) and not args.gpu else None
    if threads is not None:  # and a job that arrives after the run has planned its threads
        from benchmarks.arriving_load import bench_arriving_load

        threads["arriving"] = bench_arriving_load("shakespeare_char", 1200, min(rounds, 2), 6.0,
                                                  log=lambda s: print(s, flush=True))
        a = threads["arriving"]
        print(f"  threads, a busy job arriving {a['arrive_s']:g} s in: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in a["wall_s"].items())
              + f"; auto/best {a['auto/best']:.2f}", flush=True)
    memory = bench_memory() if args.full or args.memory else None
    if results:
        print(table(results))
    for r in results:
        if r.get("platform_mfu_steady") is not None:
            print(f"  {r['preset']} on {r['device']}: steady-state MFU {pct(r['platform_mfu_steady']):.1f}% "
                  f"(target >= {TARGETS['gpu_mfu']:.0%} on H100/H200); plain loops: "
                  + ", ".join(f"{s} {pct(r[f'{s}_mfu_steady']):.1f}%" for s in ("ref", "model")
                              if f"{s}_mfu_steady" in r)
                  + f"; the run's whole fit, compilation included: {fmt(pct(r.get('platform_mfu')), '.1f')}%")
    if memory:
        print(f"  activation checkpointing ({memory['shape']}): saved activations "
              f"{memory['saved_bytes_plain'] / 2**20:.1f} -> {memory['saved_bytes_checkpointed'] / 2**20:.1f} MiB "
              f"({memory['activation_memory_ratio']:.2f}x), max |grad diff| {memory['max_grad_diff']:.1e}")
    out = {"mode": mode, "threads": plan.threads, "load_start": load, "load_end": os.getloadavg()[0],
           "seconds": time.time() - t0, "torch": torch.__version__, "presets": results,
           "thread_bench": threads, "memory": memory, "targets": TARGETS}
    busy = load > 0.5 * plan.cores
    if busy:
        print(f"  other processes busy on {load:.1f} of {plan.cores} cores: throughput ratios judged "
              "per CPU-second")
    missed = misses(results, threads, busy)
    out["missed"] = missed
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for m in missed:
        print(f"  BELOW TARGET {m}")
    print(f"bench_train: {time.time() - t0:.0f} s; other load at start {load:.1f}, load average now "
          f"{os.getloadavg()[0]:.2f}")
    return 1 if missed else 0


def extra_modes(args: argparse.Namespace, presets: list[str], rounds: int, loop_steps: int,
                threads: int, extra: list[str], load: float, t0: float) -> int:
    """``--to-loss`` and ``--levers``: their own tables, JSON and target checks."""
    from benchmarks import levers, to_loss

    out: dict[str, Any] = {"mode": "to_loss" if args.to_loss else "levers", "threads": threads,
                           "load_start": load, "torch": torch.__version__}
    missed: list[str] = []
    if args.levers:
        out["levers"] = [levers.bench_levers(n, PRESETS[n], loop_steps) for n in presets]
    if args.to_loss:
        tolerance = to_loss.LOSS_TOLERANCE if args.loss_tolerance is None else args.loss_tolerance
        with tempfile.TemporaryDirectory(prefix="scalelab-bench-") as tmp:
            res = [to_loss.bench_to_loss(n, PRESETS[n], rounds, Path(tmp), threads, extra,
                                           args.platform_override, own_init=args.ref_own_init,
                                           seeds=args.seeds, tolerance=tolerance)
                   for n in presets]
        print(to_loss.table(res))
        out["to_loss"], missed = res, to_loss.misses(res)
    out.update(load_end=os.getloadavg()[0], seconds=time.time() - t0, missed=missed)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for m in missed:
        print(f"  BELOW TARGET {m}")
    print(f"bench_train: {time.time() - t0:.0f} s; other load at start {load:.1f}, load average now "
          f"{out['load_end']:.2f}")
    return 1 if missed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        loop_child(int(sys.argv[2]))
    else:
        sys.exit(main(sys.argv[1:]))
