"""benchmarks/bench_train: --compare, the target check, and one tiny real run."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmarks.bench_train import (
    CHILD,
    auto_over_best,
    auto_twin,
    compare,
    misses,
    table,
    thread_settings,
)

ROOT = Path(__file__).resolve().parents[2]


def _row(preset: str, ref: float | None, model: float, platform: float, **extra: float) -> dict:
    r = {"preset": preset, "ref_tokens_per_s": ref, "model_tokens_per_s": model,
         "platform_tokens_per_s": platform, "platform/model": platform / model,
         "platform_time_to_first_step_s": 3.0, "platform_overhead_share": 0.02,
         "platform_wall/ref_wall": 0.9}
    if ref:
        r["model/ref"] = model / ref
    return {**r, **extra}


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text(json.dumps({"presets": rows}))
    return str(path)


def test_compare_prints_ratios_and_passes_within_tolerance(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old = _write(tmp_path / "old.json", [_row("shakespeare_char", 1000, 1000, 1000)])
    new = _write(tmp_path / "new.json", [_row("shakespeare_char", 1000, 1000, 1400),
                                         _row("encdec", None, 10, 10)])  # not in old: skipped
    assert compare(old, new, tolerance=0.05) == 0
    out = capsys.readouterr().out
    assert "platform_tokens_per_s" in out and "1.40" in out and "encdec" not in out


def test_compare_fails_on_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old = _write(tmp_path / "old.json", [_row("pystdlib_small", 1000, 1000, 1000)])
    new = _write(tmp_path / "new.json", [_row("pystdlib_small", 1000, 1000, 900)])
    assert compare(old, new, tolerance=0.05) == 1
    captured = capsys.readouterr()
    assert "REGRESSED" in captured.out and "pystdlib_small platform_tokens_per_s" in captured.err
    assert compare(old, new, tolerance=0.15) == 0  # a 10 % drop is inside 15 %


def test_misses_names_every_ratio_below_target() -> None:
    good = _row("a", 1000, 1010, 1000)
    assert misses([good], None) == []
    bad = _row("b", 1000, 900, 800, platform_time_to_first_step_s=9.5, platform_overhead_share=0.2)
    found = " | ".join(misses([bad], {"idle": {"auto/best": 0.9}, "loaded": {"auto/best": 0.3}}))
    for what in ("model/ref 0.90", "platform/model 0.89", "first step 9.5", "overhead 20%",
                 "threads idle", "threads loaded"):
        assert what in found
    assert "b " in table([bad]).splitlines()[2][:3]


def test_busy_machine_judges_throughput_per_cpu_second() -> None:
    row = _row("c", 1000, 800, 800)  # wall ratios below target: the load hit side 2 harder
    row.update({"model/ref_cpu": 1.01, "platform/model_cpu": 0.99})
    assert any("model/ref" in m for m in misses([row], None, busy=False))
    assert misses([row], None, busy=True) == []
    row["platform/model_cpu"] = 0.9
    assert misses([row], None, busy=True) == ["c: platform/model 0.90 < 0.97 (per CPU-second)"]


def test_a_miss_is_printed_with_the_places_that_show_it() -> None:
    """A ratio just under its target is not printed rounded up to it ("1.00 < 1.0")."""
    row = _row("d", 1000, 996, 996)
    assert misses([row], None) == ["d: model/ref 0.996 < 1.0"]
    row["model/ref"] = 0.99996
    assert misses([row], None) == ["d: model/ref 0.99996 < 1.0"]


def test_auto_pools_its_samples_with_the_setting_it_ran_as() -> None:
    labels = set(thread_settings())
    assert {"auto", "1t"} <= labels
    assert auto_twin([(1, "")] * 3) == auto_twin([(1, ""), (1, "PASSIVE")]) == "1t"  # no team to wait
    assert auto_twin([(2, "")] * 2) == "2t/default"
    assert auto_twin([(2, ""), (2, "PASSIVE")]) is None  # not the same in every round
    assert auto_twin([(1000, "")]) is None  # no such hand-picked setting
    ms = {"auto": [50.0, 52.0, 60.0], "1t": [40.0, 41.0, 42.0], "2t/ACTIVE": [45.0, 46.0, 47.0]}
    med, ratio = auto_over_best(ms, None)
    assert med["auto"] == 52.0 and ratio == pytest.approx(41.0 / 52.0)
    # auto ran as 2 threads ACTIVE: one configuration, six samples, median (47 + 50) / 2
    med, ratio = auto_over_best(ms, "2t/ACTIVE")
    assert med["auto"] == med["2t/ACTIVE"] == 48.5 and ratio == pytest.approx(41.0 / 48.5)
    med, ratio = auto_over_best(ms, "1t")  # pooled, auto's slow samples count against 1t too
    assert med["auto"] == 46.0 and ratio == 1.0


def test_the_thread_child_reports_the_setting_it_ran_with() -> None:
    env = {"SCALELAB_BENCH_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_train", CHILD, "1"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["threads"] == 1 and got["policy"] == "PASSIVE" and got["ms"] > 0


@pytest.mark.slow
def test_quick_bench_runs_end_to_end(tmp_path: Path) -> None:
    """The smallest real run: encoder-decoder preset (synthetic data, no cache), one round."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "train", "--presets", "encdec", "--rounds", "1",
         "--loop-steps", "3", "--platform-steps", "60", "--memory", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed on a busy machine
    res = json.loads(out.read_text())
    (row,) = res["presets"]
    assert row["preset"] == "encdec" and row["model_tokens_per_s"] > 0
    assert row["platform_tokens_per_s"] > 0 and row["platform_time_to_first_step_s"] > 0
    assert row["platform_val_event_s"] > 0 and 0 < row["platform_overhead_default_run"] < 1
    # (3)/(2) from the turns the run and the plain loop took (benchmarks/lockstep.py)
    assert row["platform_turns"] > 40 and row["platform_partner_tokens_per_s"] > 0
    assert row["platform/model"] == pytest.approx(
        row["platform_tokens_per_s"] / row["platform_partner_tokens_per_s"])
    assert "ref_tokens_per_s" not in row  # no hand-written encoder-decoder
    assert res["memory"]["activation_memory_ratio"] < 0.5
    assert "(3)/(2)" in proc.stdout


def test_gpu_mode_builds_its_presets_on_cpu(capsys: pytest.CaptureFixture) -> None:
    """--gpu cannot run here; its presets must still compose, validate and size to ~124M."""
    import torch
    from benchmarks.bench_train import GPU_PRESETS, MODES, compose, main

    from scalelab.config.spec import build_spec

    assert set(MODES["gpu"][0]) == set(GPU_PRESETS)
    for name, overrides in GPU_PRESETS.items():
        spec = build_spec(compose(overrides))
        assert spec.block_size == 1024, name
        n = spec.with_vocab(50257).n_params()
        assert 100e6 < n < 170e6, (name, n)
    if not torch.cuda.is_available():
        assert main(["--gpu"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_projected_overhead_counts_the_defaults_validations() -> None:
    from benchmarks.bench_train import overhead_of, projected_overhead

    plat = {"step_s": 0.1, "val_event_s": 1.0, "after_fit_s": 2.0, "time_to_first_step_s": 3.0}
    # 500 steps, val every 100: 4 in-loop validations + the end = 6 s of 3 + 50 + 6
    assert projected_overhead(plat, 500, 100) == pytest.approx(6 / 59)
    assert projected_overhead({**plat, "val_event_s": None}, 500, 100) is None
    assert overhead_of({"platform_overhead_default_run": 0.03, "platform_overhead_share": 0.2}) == 0.03
    assert overhead_of({"platform_overhead_default_run": None, "platform_overhead_share": 0.2}) == 0.2


def test_to_loss_early_stop_is_a_valid_callback_override() -> None:
    """The override the --to-loss mode adds composes and instantiates Lightning's EarlyStopping
    with the reference's loss as its threshold."""
    from benchmarks.bench_train import compose
    from benchmarks.to_loss import early_stop_override, misses
    from hydra.utils import instantiate

    cfg = compose(["+experiment=shakespeare_char", early_stop_override(1.8765)])
    cb = instantiate(cfg.callbacks.to_loss)
    assert type(cb).__name__ == "EarlyStopping" and cb.monitor == "val/loss"
    assert cb.stopping_threshold == pytest.approx(1.8765, abs=1e-5)
    assert misses([{"preset": "a", "platform_wall/ref_wall": 0.7}]) == []
    assert "0.95x" in misses([{"preset": "b", "platform_wall/ref_wall": 0.95}])[0]


def test_to_loss_counts_a_loss_within_the_tolerance_as_reached() -> None:
    """bf16 ends a coin flip either side of the fp32 reference: 1.8714 against 1.8713 reaches
    within the default 0.005, not strictly; missing by more than the tolerance never reaches."""
    from benchmarks.to_loss import LOSS_TOLERANCE, reached

    ref = 1.8713
    assert reached(1.8714, ref + LOSS_TOLERANCE) and not reached(1.8714, ref)
    assert reached(ref, ref) and reached(1.85, ref)  # equal, or below
    assert not reached(ref + LOSS_TOLERANCE + 1e-4, ref + LOSS_TOLERANCE)
    assert not reached(None, ref)  # the run logged no val loss


def test_levers_never_run_bf16_without_native_support() -> None:
    from benchmarks.levers import variants

    from scalelab.runtime import cpu_has_native_bf16

    v = variants()
    assert {"eager/fused", "eager/foreach", "compile/fused"} <= set(v)
    assert ("eager/fused/bf16" in v) == ("compile/fused/bf16" in v) == cpu_has_native_bf16()


def test_gpu_levers_runs_every_variant_on_cpu(tmp_path: Path) -> None:
    """A mistake in the GPU lever script costs device minutes: its plumbing runs here, eager."""
    out = tmp_path / "levers.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_levers", "--cpu-smoke", "--steps", "1",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())["variants"]
    assert list(res) == ["baseline", "vocab 50304", "loss in graph", "batch 32", "blocks once"]
    assert res["baseline"]["speedup_per_token"] == 1.0
    assert res["vocab 50304"]["params"] - res["baseline"]["params"] == 44 * 32  # 44 padded rows, d 32
    assert all(v["tokens_per_s"] > 0 for v in res.values())


def test_step_parts_times_the_pieces_of_a_step_and_switches_the_fixes(tmp_path: Path) -> None:
    """benchmarks/step_parts: the breakdown holds every piece, nested pieces within the whole;
    the steps that do not log make no host sync; the A/B mode really runs blocks with the fixes
    off and on."""
    def run(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.step_parts", "--preset", "encdec", *args,
                               "train.num_threads=1", "optim.warmup_steps=1", f"paths.data_dir={tmp_path}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    table = run("--start", "3", "--steps", "6").split("steps from step 3, ms a step:\n")[1]
    parts = {ln.split()[0]: float(ln.split()[1]) for ln in table.splitlines()}
    assert set(parts) >= {"total", "optimizer+closure", "backward", "forward+loss", "fetch", "clipping"}
    assert parts["optimizer+closure"] > parts["backward"] + parts["forward+loss"] > parts["backward"] > 0
    # a GPU step can run ahead of the host only if nothing waits on the device: the steps that do
    # not log make no .item() or other host sync (the logging steps do, counted to show it works)
    out = run("--syncs", "--start", "3", "--steps", "12")
    found = re.search(r"(\d+) on the (\d+) logging steps, (\d+) on the other (\d+)", out)
    assert found, out[-2000:]
    on_log, n_log, others, n_others = map(int, found.groups())
    assert n_log == 1 and on_log > 0 and n_others == 11 and others == 0


def test_loop_overhead_alternates_hand_and_lightning_blocks(tmp_path: Path) -> None:
    """benchmarks/loop_overhead: as many hand-loop blocks as Lightning blocks, both timed."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.loop_overhead", "--preset", "encdec", "--blocks", "3",
                           "--block", "2", "--start", "2", "train.num_threads=1", "optim.warmup_steps=1",
                           f"paths.data_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.search(r"hand loop (\d+) us a step, Lightning (\d+) us a step: hand/Lightning speed ([\d.]+) "
                      r"\(3 \+ 3 blocks of 2 steps\)", proc.stdout)
    assert found, proc.stdout[-2000:]
    hand, lightning, ratio = int(found[1]), int(found[2]), float(found[3])
    assert hand > 0 and lightning > 0 and ratio == pytest.approx(lightning / hand, rel=0.02)


def test_small_heads_times_every_path_and_says_which_the_model_takes() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.small_heads", "--rounds", "2", "--reps", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = next(ln.split() for ln in proc.stdout.splitlines() if ln.lstrip().startswith("B, H"))
    paths = [w for w, unit in itertools.pairwise(header) if unit == "us"]  # "SDPA us", "kernel us", ...
    assert paths[0] == "SDPA" and "matmuls" in paths  # and "kernel" where it builds
    takes = "SDPA|scalelab's small-head kernel|the written-out small-head path"
    rows = re.findall(rf"^\s*\((\d+), (\d+), (\d+), (\d+)\)\s+([\d.x ]+?)\s+({takes})$", proc.stdout, re.M)
    assert len(rows) == 5, proc.stdout
    for *_, numbers, _takes in rows:
        values = [float(v.rstrip("x")) for v in numbers.split()]
        # each path's microseconds, then each other path's speed over SDPA's
        assert len(values) == 2 * len(paths) - 1 and all(v > 0 for v in values), numbers


@pytest.mark.parametrize("shape, own_draw_differs", [
    ({}, True),  # GPT-2: LayerNorm, tanh GELU, learned positions, tied embeddings
    # Llama with GQA: without biases the reference happens to draw in the platform's order
    ({"norm": "rmsnorm", "mlp": "swiglu", "position": "rope", "n_kv_heads": 2, "bias": False,
      "tie_embeddings": False}, False),
    ({"arch": "encoder", "norm_position": "post"}, True),  # BERT-style, no final norm
])
def test_the_reference_starts_from_the_platforms_initial_weights(shape: dict, own_draw_differs: bool) -> None:
    """--to-loss: the hand-written model loads the platform's own draw (torch.manual_seed(seed);
    Transformer(cfg)), so both sides start from one point; --ref-own-init draws its own, in the
    reference's parameter order."""
    import torch
    from benchmarks.to_loss import reference_model

    from scalelab.model import ModelConfig, Transformer

    cfg = ModelConfig(**{"vocab_size": 37, "max_seq_len": 16, "d_model": 32, "n_layers": 2,
                         "n_heads": 4, **shape})
    torch.manual_seed(7)
    platform = Transformer(cfg).eval()
    ids = torch.randint(0, 37, (3, 16))
    with torch.no_grad():
        want = platform(ids)
        shared = reference_model(cfg, 7, own_init=False).eval()(ids)
        own = reference_model(cfg, 7, own_init=True).eval()(ids)
    torch.testing.assert_close(shared, want, rtol=1e-5, atol=1e-5)
    assert bool((own - want).abs().max() > 1e-3) == own_draw_differs


def test_a_run_starts_from_the_draw_the_reference_copies(tmp_path: Path, train_cli: object,
                                                          shared_data_dir: Path) -> None:
    """What reference_model assumes of scalelab-train: its initial weights are
    ``torch.manual_seed(seed); Transformer(cfg)``. One step at lr 1e-30 leaves them as drawn."""
    import torch

    from scalelab.cli.eval import load_model
    from scalelab.model import Transformer

    out = tmp_path / "run"
    proc = train_cli.run(  # type: ignore[attr-defined]
        "+experiment=shakespeare_char", f"data.path={shared_data_dir / 'tinyshakespeare.txt'}",
        "model.n_layers=1", "model.d_model=32", "train.max_steps=1", "optim.lr=1e-30",
        "optim.warmup_steps=0", "logger=none", "seed=11", f"paths.output_dir={out}",
        f"paths.data_dir={train_cli.data_dir()}")  # type: ignore[attr-defined]
    assert proc.returncode == 0, proc.stderr[-2000:]
    trained, _, _ = load_model(str(out / "checkpoints" / "last.ckpt"))
    torch.manual_seed(11)
    drawn = Transformer(trained.cfg).state_dict()
    for key, value in trained.state_dict().items():
        torch.testing.assert_close(value, drawn[key], rtol=0, atol=1e-20)


def test_the_plain_loops_split_decay_as_the_run_does() -> None:
    """Both plain-loop sides get the platform's AdamW groups: matrices decay, embeddings (and
    the output layer tied to them) do not. The reference once decayed its embeddings too (as
    nanoGPT does), a recipe the run did not train."""
    import types

    import torch
    from benchmarks.bench_train import PlainLoop
    from benchmarks.reference_gpt import ReferenceLM

    from scalelab.model import ModelConfig, Transformer
    from scalelab.training.optim import param_groups

    cfg = ModelConfig(vocab_size=37, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)
    optim = types.SimpleNamespace(weight_decay=0.1, decay_embeddings=False, fused=None, lr=1e-3,
                                  beta1=0.9, beta2=0.99, eps=1e-8, grad_clip=1.0)
    prep = {"spec": types.SimpleNamespace(optim=optim, objective="causal"),
            "batches": [{"input_ids": torch.zeros(2, 16, dtype=torch.long)}]}
    for model in (ReferenceLM(cfg), Transformer(cfg)):
        loop = PlainLoop(model, prep, "ref" if isinstance(model, ReferenceLM) else "model")
        want, _ = param_groups(model, 0.1)
        got = [(g["weight_decay"], {id(p) for p in g["params"]}) for g in loop.opt.param_groups]
        assert got == [(g["weight_decay"], {id(p) for p in g["params"]}) for g in want]
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        assert embeddings and embeddings <= got[1][1] and got[1][0] == 0.0


def test_to_loss_trains_one_recipe_on_both_sides_a_seed_a_round(tmp_path: Path) -> None:
    """Three fp32 steps from one start: the hand-written loop and scalelab-train end within
    1e-5 of each other (same weights, batches, AdamW groups and schedule); each round runs its
    own seed, and a round counts as reached when the platform's loss is at most the reference's
    plus the default tolerance (so both here: they differ by < 1e-5), strictly when at most the
    reference's itself."""
    out = tmp_path / "to_loss.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "train", "--to-loss", "--presets", "sweep_point",
         "--rounds", "2", "--seeds", "3,4", "--json", str(out), "--", "train.max_steps=3",
         "train.val_every=3", "optim.warmup_steps=1", "trainer.precision=32-true"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a ratio above 0.8 on a busy machine
    (res,) = json.loads(out.read_text())["to_loss"]
    rounds = res["per_round"]
    assert [r["seed"] for r in rounds] == [3, 4] and res["rounds"] == 2
    assert abs(rounds[0]["ref_val_loss"] - rounds[1]["ref_val_loss"]) > 1e-4  # two seeds, two runs
    for r in rounds:
        assert r["platform_val_loss"] == pytest.approx(r["ref_val_loss"], abs=1e-5)
        assert r["reached"] and r["wall_ratio"] != float("inf")
        assert r["strict"] == (r["platform_val_loss"] <= r["ref_val_loss"] + 1e-6)
    assert res["reached"] == 2 and res["loss_tolerance"] == 0.005
    assert res["strict"] == sum(r["strict"] for r in rounds)
    gaps = [r["platform_val_loss"] - r["ref_val_loss"] for r in rounds]
    walls = [r["platform_wall_s"] / r["ref_wall_s"] for r in rounds]
    assert res["val_gap"] == pytest.approx(sum(gaps) / 2) and res["walls"] == pytest.approx(sum(walls) / 2)
    assert 0 < res["walls"] < float("inf")  # reached or not, each round's walls
    assert re.search(r"sweep_point .* 2/2 +[0-2]/2 ", proc.stdout)


def test_the_reference_trains_on_the_batches_a_run_trains_on_across_epochs() -> None:
    """A run longer than an epoch: the reference's batches equal those a real Lightning fit takes
    from the same DataModule, epoch after epoch. It once restarted from batch 0 at each epoch,
    where the run goes on to new batches (shakespeare_char's 2000 steps cross its 1307-batch
    epoch, so the reference trained its last 693 steps on repeated data)."""
    import pytorch_lightning as pl
    import torch
    from benchmarks.bench_train import PRESETS, prepare_preset
    from benchmarks.to_loss import train_batches

    class Record(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[torch.Tensor] = []

        def training_step(self, batch: dict[str, torch.Tensor], _: int) -> torch.Tensor:
            self.seen.append(batch["input_ids"].clone())
            return (self.w**2).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    steps, dms = 7, []
    for _ in range(2):
        dm = prepare_preset(PRESETS["sweep_point"], n_batches=1)["datamodule"]
        dm.epoch_batches = 3  # three epochs in seven steps
        dms.append(dm)
    run = Record()
    pl.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False,
               limit_val_batches=0).fit(run, datamodule=dms[0])
    ref = [b["input_ids"] for b in train_batches(dms[1], steps)]
    assert len(run.seen) == len(ref) == steps
    assert all(torch.equal(a, b) for a, b in zip(run.seen, ref, strict=True))
    assert not torch.equal(ref[3], ref[0])  # the second epoch goes on, not back to batch 0


def test_the_arriving_job_comes_mid_run_and_can_leave_again(tmp_path: Path) -> None:
    """benchmarks/arriving_load.py: the busy job starts while the run is going (the run would
    fail the bench if it ended first), a job with a stay ends by itself, and the bench's verdict
    reaches the training bench's misses."""
    from benchmarks.arriving_load import TARGET, busy_job, timed_run
    from benchmarks.bench_train import PRESETS

    t0 = time.monotonic()
    subprocess.run(busy_job(0.3), check=True, timeout=60)
    assert time.monotonic() - t0 < 30
    got = timed_run([*PRESETS["sweep_point"], "train.max_steps=300"], tmp_path, arrive_s=1.0, stay_s=1.0)
    assert got["wall_s"] > 1.0 and got["tokens_per_s"] > 0
    assert all(" -> " in c for c in got["changes"])  # "2 -> 1" lines from the run's log, if any
    ok = {"idle": {"auto/best": 1.0}, "loaded": {"auto/best": 1.0}}
    assert misses([], {**ok, "arriving": {"auto/best": TARGET + 0.05}}) == []
    assert "arriving mid-run" in misses([], {**ok, "arriving": {"auto/best": TARGET - 0.2}})[0]
