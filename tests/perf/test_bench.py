"""The bench (benchmarks/): its ratio maths, target verdict, turn order, arguments and presets,
the reference model's start, and real end-to-end runs of a tiny preset (no speed assertions)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from benchmarks.__main__ import main, parse, plan
from benchmarks.harness import PlainTurns, compare_order, turn_order
from benchmarks.platform_run import projected_overhead, run_figures
from benchmarks.presets import GPU_PRESETS, ROOT, preset_overrides, sweep_point_overrides
from benchmarks.verdict import below, median_ratio, misses, table

from scalelab.model import ModelConfig, Transformer


def _row(preset: str = "a", **figures: float | None) -> dict:
    return {"preset": preset, "model/ref": 1.0, "platform/model": 1.0, "time_to_first_step_s": 3.0,
            **figures}


def test_every_target_missed_is_named_once() -> None:
    assert misses([_row()]) == []
    found = misses([_row("b", **{"model/ref": 0.9, "platform/model": 0.89, "time_to_first_step_s": 12.5})])
    assert found == ["b: model/ref 0.90 < 1.0 - 0.03 noise", "b: platform/model 0.89 < 0.9",
                     "b: time to first step 12.5 s > 10.0 s"]
    assert "b " in table([_row("b")]).splitlines()[2][:3]


def test_model_over_ref_passes_within_the_noise() -> None:
    assert misses([_row(**{"model/ref": 0.975})]) == []
    assert misses([_row(**{"model/ref": 0.965})]) == ["a: model/ref 0.96 < 1.0 - 0.03 noise"]


def test_compare_targets_are_looser_for_a_sweep_point() -> None:
    assert misses([{"preset": "pystdlib_small", "new/old": 0.85}]) == ["pystdlib_small: new/old 0.85 < 0.9"]
    assert misses([{"preset": "sweep_point", "new/old": 0.85}]) == []
    assert misses([{"preset": "sweep_point", "new/old": 0.79}]) == ["sweep_point: new/old 0.79 < 0.8"]
    assert misses([{"preset": "x", "new/old": 1.2, "new_time_to_first_step_s": 11.0}]) == [
        "x: time to first step 11.0 s > 10.0 s"]


def test_a_miss_is_printed_with_the_places_that_show_it() -> None:
    assert below(0.996, 1.0) == "0.996" and below(0.89, 0.9) == "0.89"
    assert below(0.89996, 0.9) == "0.89996"


def test_ratios_are_medians_of_each_rounds_own_ratio() -> None:
    rounds = [{"a": 100.0, "b": 50.0}, {"a": 300.0, "b": 100.0}, {"a": 10.0, "b": 10.0}, {"a": 5.0}]
    assert median_ratio(rounds, "a", "b") == 2.0  # of 2, 3, 1; a round without b is left out
    assert median_ratio([{"a": 1.0, "b": 0.0}], "a", "b") is None


def test_plain_loops_take_turns_in_alternating_order() -> None:
    calls: list[str] = []

    class Loop:
        def __init__(self, name: str) -> None:
            self.name = name

        def timed_turn(self, steps: int) -> tuple[float, float, int]:
            calls.append(f"{self.name}{steps}")
            return 1.0, 1.0, 10 * steps

    turns = PlainTurns({"model": Loop("m"), "ref": Loop("r")}, 3)  # type: ignore[dict-item]
    got = [turns() for _ in range(3)]
    assert calls == ["m3", "r3", "r3", "m3", "m3", "r3"]
    assert got[0] == {"model": (1.0, 1.0, 30), "ref": (1.0, 1.0, 30)}
    assert turn_order(["x"], 1) == ["x"]
    assert [compare_order(r) for r in range(3)] == [("old", "new"), ("new", "old"), ("old", "new")]


def test_run_figures_count_steady_turns_and_leave_out_pauses() -> None:
    # cycles: (wall, cpu, tokens, held a validation); the first two are warm-up
    cycles = [[5.0, 5.0, 100, False]] * 2 + [[0.1, 0.1, 10, False], [9.0, 9.0, 10, True],
                                             [0.3, 0.3, 10, False]]
    phases = {"cycles": cycles, "pauses": [[0.5, 0.0]] * 4, "tokens": 140,
              "val_gaps": [[2.0, 2.0], [4.0, 4.0]], "first_step_unix": 103.0, "fit_end_unix": 110.0,
              "val_loss": 1.5, "final_step": 5}
    got = run_figures(phases, t0=100.0, t_end=112.0, turn_steps=2)
    assert got["tokens_per_s"] == pytest.approx(20 / 0.4) and got["turns"] == 2
    assert got["step_s"] == pytest.approx(0.1)  # a turn is 2 steps
    assert got["time_to_first_step_s"] == 3.0 and got["val_event_s"] == 3.0
    assert got["after_fit_s"] == 2.0 and got["wall_s"] == pytest.approx(12.0 - 2.0)
    assert got["val_loss"] == 1.5 and got["steps"] == 5
    alone = run_figures({**phases, "cycles": [], "pauses": []}, 100.0, 112.0)  # --to-loss: no turns
    assert alone["tokens_per_s"] is None and alone["wall_s"] == 12.0 and alone["val_loss"] == 1.5


def test_projected_overhead_counts_the_defaults_validations() -> None:
    run = {"step_s": 0.1, "val_event_s": 1.0, "after_fit_s": 2.0, "time_to_first_step_s": 3.0}
    # 500 steps, val every 100: 4 in-loop validations + the end = 6 s of 3 + 50 + 6
    assert projected_overhead(run, 500, 100) == pytest.approx(6 / 59)
    assert projected_overhead({**run, "val_event_s": None}, 500, 100) is None


def test_arguments_modes_and_overrides() -> None:
    args, extra = parse(["train", "--presets", "encdec,llama", "--rounds", "2", "--", "seed=3"])
    assert plan(args) == (["encdec", "llama"], 2, 110, 1) and extra == ["seed=3"]
    args, _ = parse(["--full"])
    assert plan(args)[0][-1] == "sweep_point" and plan(args)[1:] == (3, 300, 1)
    args, _ = parse(["--gpu", "--steps", "50"])
    assert plan(args) == (list(GPU_PRESETS), 2, 50, 10)
    args, _ = parse(["--compare", str(ROOT)])
    assert args.compare == ROOT
    with pytest.raises(ValueError, match="--compare /nowhere: no src/scalelab"):
        parse(["--compare", "/nowhere"])
    with pytest.raises(ValueError, match="--gpu"):
        parse(["--gpu", "--to-loss"])


def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert main(["--presets", "nosuch", "--rounds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("benchmarks: --presets: no preset 'nosuch'") and "\n" not in err
    if not torch.cuda.is_available():
        assert main(["--gpu"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


def test_sweep_point_runs_as_each_checkouts_sweep_would(tmp_path: Path) -> None:
    """The sweep preset's own train_overrides come first, from the checkout that runs: a key only
    one checkout has (e.g. model.attention) reaches only that checkout's run."""
    conf = tmp_path / "scalelab" / "conf" / "sweep"
    conf.mkdir(parents=True)
    (conf / "cpu_medium.yaml").write_text("train_overrides:\n  - model=gpt2_tiny\n  - model.attention=math\n")
    got = preset_overrides("sweep_point", tmp_path)
    assert got[:2] == ["model=gpt2_tiny", "model.attention=math"] and "train.max_steps=1842" in got
    assert sweep_point_overrides(ROOT / "src")[0].startswith("model=")
    with pytest.raises(ValueError, match="no preset 'gpt2_124m'"):
        preset_overrides("gpt2_124m")  # a GPU preset only with gpu=True


def test_gpu_presets_compose_and_size_to_124m() -> None:
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec

    for name in GPU_PRESETS:
        spec = build_spec(compose("train", preset_overrides(name, gpu=True)))
        assert spec.block_size == 1024, name
        assert 100e6 < spec.with_vocab(50257).n_params() < 170e6, name


def test_the_reference_maps_either_name_of_the_fused_projection() -> None:
    from benchmarks.reference_gpt import _reference_name

    assert _reference_name("self_attn.fn.qkv_proj.weight") == _reference_name("self_attn.qkv.weight") == "qkv.weight"
    assert _reference_name("self_attn.fn.o_proj.bias") == "proj.bias"
    assert _reference_name("mlp.norm.weight") == "ln2.weight" and _reference_name("mlp.fn.gate.weight") is None
    with pytest.raises(KeyError):
        _reference_name("mlp.fn.extra.weight")


@pytest.mark.parametrize("shape, own_draw_differs", [
    ({}, True),  # GPT-2: LayerNorm, tanh GELU, learned positions, tied embeddings
    ({"norm": "rmsnorm", "mlp": "swiglu", "position": "rope", "n_kv_heads": 2, "bias": False,
      "tie_embeddings": False}, False),  # Llama with GQA: the reference draws in the same order
    ({"arch": "encoder", "norm_position": "post"}, True),  # BERT-style, no final norm
])
def test_the_reference_starts_from_the_platforms_initial_weights(shape: dict, own_draw_differs: bool) -> None:
    from benchmarks.to_loss import reference_model

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


def test_the_plain_loops_split_decay_as_the_run_does() -> None:
    """Both plain-loop sides get the platform's AdamW groups: matrices decay, embeddings (and
    the output layer tied to them) do not."""
    from benchmarks.plain_loop import PlainLoop
    from benchmarks.reference_gpt import ReferenceLM

    from scalelab.training.optim import param_groups

    cfg = ModelConfig(vocab_size=37, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)
    optim = types.SimpleNamespace(weight_decay=0.1, decay_embeddings=False, fused=None, lr=1e-3,
                                  beta1=0.9, beta2=0.99, eps=1e-8, grad_clip=1.0)
    prep = {"spec": types.SimpleNamespace(optim=optim, objective="causal"),
            "batches": [{"input_ids": torch.zeros(2, 16, dtype=torch.long),
                         "labels": torch.zeros(2, 16, dtype=torch.long)}]}
    for model in (ReferenceLM(cfg), Transformer(cfg)):
        loop = PlainLoop(model, prep, "ref" if isinstance(model, ReferenceLM) else "model")
        want, _ = param_groups(model, 0.1)
        got = [(g["weight_decay"], {id(p) for p in g["params"]}) for g in loop.opt.param_groups]
        assert got == [(g["weight_decay"], {id(p) for p in g["params"]}) for g in want]
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        assert embeddings and embeddings <= got[1][1] and got[1][0] == 0.0
        wall, _, tokens = loop.timed_turn(2)
        assert wall > 0 and tokens == 64


def test_to_loss_early_stop_is_a_valid_callback_override() -> None:
    from benchmarks.to_loss import LOSS_TOLERANCE, early_stop_override, reached
    from hydra.utils import instantiate

    from scalelab.config.compose import compose

    cfg = compose("train", ["+experiment=shakespeare_char", early_stop_override(1.8765)])
    cb = instantiate(cfg.callbacks.to_loss)
    assert type(cb).__name__ == "EarlyStopping" and cb.monitor == "val/loss"
    assert cb.stopping_threshold == pytest.approx(1.8765, abs=1e-5)
    ref = 1.8713
    assert reached(1.8714, ref + LOSS_TOLERANCE) and not reached(1.8714, ref)
    assert reached(ref, ref) and not reached(None, ref)


def test_a_run_starts_from_the_draw_the_reference_copies(tmp_path: Path, train_cli: object,
                                                          shared_data_dir: Path) -> None:
    """What reference_model assumes of scalelab-train: its initial weights are
    ``torch.manual_seed(seed); Transformer(cfg)``. One step at lr 1e-30 leaves them as drawn."""
    from scalelab.cli.eval import load_model

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


def test_the_reference_trains_on_the_batches_a_run_trains_on_across_epochs() -> None:
    """A run longer than an epoch: the reference's batches equal those a real Lightning fit takes
    from the same DataModule, epoch after epoch, not the first epoch's again."""
    import pytorch_lightning as pl
    from benchmarks.presets import prepare_preset
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
        dm = prepare_preset(preset_overrides("sweep_point"), n_batches=1)["datamodule"]
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


def _bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--json", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed on a busy machine
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_three_sides_run_end_to_end(tmp_path: Path) -> None:
    """The smallest real run: the encoder-decoder preset (synthetic data), one round."""
    proc, res = _bench(tmp_path, "--presets", "encdec", "--rounds", "1", "--steps", "30",
                       "--", "optim.warmup_steps=2")
    (row,) = res["presets"]
    assert row["model_tokens_per_s"] > 0 and row["platform_tokens_per_s"] > 0
    assert row["ref_tokens_per_s"] is None  # no hand-written encoder-decoder
    (r,) = row["rounds"]
    assert r["platform_turns"] >= 20 and r["platform_time_to_first_step_s"] > 0
    assert r["platform_val_event_s"] > 0 and 0 < row["overhead_share"] < 1
    assert row["platform/model"] == pytest.approx(r["platform_tokens_per_s"] / r["model_tokens_per_s"])
    assert "(3)/(2)" in proc.stdout and "benchmarks:" in proc.stdout


@pytest.mark.slow
def test_compare_runs_two_checkouts_in_turns(tmp_path: Path) -> None:
    """This checkout against itself: both sides train the same steps from the same seed, so
    their val losses agree while each reports its own tokens/s."""
    proc, res = _bench(tmp_path, "--compare", str(ROOT), "--presets", "encdec", "--rounds", "1",
                       "--steps", "20", "--", "optim.warmup_steps=2")
    (row,) = res["presets"]
    assert row["old_tokens_per_s"] > 0 and row["new_tokens_per_s"] > 0 and row["new/old"] > 0
    assert row["old_val_loss"] == pytest.approx(row["new_val_loss"], abs=1e-4)
    (r,) = row["rounds"]
    assert r["old_turns"] >= 10 and r["new_turns"] >= 10 and r["old_steps"] == r["new_steps"] == 20
    assert "new/old" in proc.stdout


@pytest.mark.slow
def test_to_loss_trains_one_recipe_on_both_sides_a_seed_a_round(tmp_path: Path) -> None:
    """Three fp32 steps from one start: the hand-written loop and scalelab-train end within
    1e-5 of each other; each round runs its own seed."""
    proc, res = _bench(tmp_path, "--to-loss", "--presets", "sweep_point", "--rounds", "2",
                       "--seeds", "3,4", "--", "train.max_steps=3", "train.val_every=3",
                       "optim.warmup_steps=1", "trainer.precision=32-true")
    (row,) = res["presets"]
    rounds = row["per_round"]
    assert [r["seed"] for r in rounds] == [3, 4] and row["rounds"] == 2
    assert abs(rounds[0]["ref_val_loss"] - rounds[1]["ref_val_loss"]) > 1e-4  # two seeds, two runs
    for r in rounds:
        assert r["platform_val_loss"] == pytest.approx(r["ref_val_loss"], abs=1e-5)
        assert r["reached"] and r["wall_ratio"] != float("inf")
    assert row["reached"] == 2 and row["loss_tolerance"] == 0.005
    assert re.search(r"sweep_point .* 2/2 +[0-2]/2 ", proc.stdout)
