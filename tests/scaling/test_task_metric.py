"""The line-ending task (scaling/task_metric.py) and its two-step forecast
(scaling/task_forecast.py), on real token streams and a real (tiny) Transformer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from scalelab.data.tokenizers import byte_tokenizer
from scalelab.scaling.sweep_settings import RunSettings
from scalelab.scaling.task_forecast import MIN_RUNS, fit_accuracy, fit_task_forecaster
from scalelab.scaling.task_metric import (
    CHOICES,
    ContinuationTask,
    ending_logprobs,
    task_scores,
)

TEXT = "".join(f"    value_{i} = compute(alpha={i * 7 % 13}, beta='{'xyz'[i % 3]}' * {i})\n"
               for i in range(300))


def _tokens() -> np.ndarray:
    return np.asarray(byte_tokenizer().encode(TEXT), dtype=np.int64)


def test_each_item_has_its_true_ending_once_among_distinct_others():
    toks, nl = _tokens(), byte_tokenizer().encode("\n")[0]
    task = ContinuationTask.from_tokens(toks, nl, block=48, n_items=50, ending=12)
    assert task.sequences.shape == (50, CHOICES, 49) and task.n_items == 50
    lines = TEXT.splitlines()
    for i in range(50):
        seqs, ans = task.sequences[i], int(task.answer[i])
        assert (seqs[:, :-12] == seqs[0, :-12]).all()  # one context for the four endings
        context = bytes(seqs[0, :-12].tolist()).decode()
        true = bytes(seqs[ans, -12:].tolist()).decode()
        whole = context + true
        assert any(whole.endswith(line) for line in lines)  # the context runs into its own ending
        endings = {bytes(s[-12:].tolist()).decode() for s in seqs}
        assert len(endings) == CHOICES and all(any(ln.endswith(e) for ln in lines) for e in endings)
    assert set(task.answer.tolist()) == set(range(CHOICES))  # the true one is not always first
    again = ContinuationTask.from_tokens(toks, nl, block=48, n_items=50, ending=12)
    assert again.fingerprint == task.fingerprint
    other = ContinuationTask.from_tokens(toks, nl, block=48, n_items=50, ending=12, seed=1)
    assert other.fingerprint != task.fingerprint


def test_too_few_lines_and_bad_lengths_name_the_key():
    toks, nl = _tokens(), byte_tokenizer().encode("\n")[0]
    with pytest.raises(ValueError, match=r"sweep\.task_items=5,000") as e:
        ContinuationTask.from_tokens(toks, nl, block=48, n_items=5000, ending=12)
    assert "\n" not in str(e.value)
    same = np.asarray(byte_tokenizer().encode("    x = call(1)\n" * 50), dtype=np.int64)
    with pytest.raises(ValueError, match="too few distinct endings"):
        ContinuationTask.from_tokens(same, nl, block=48, n_items=5, ending=6)
    with pytest.raises(ValueError, match=r"sweep\.task_ending=46"):
        ContinuationTask.from_tokens(toks, nl, block=48, n_items=10, ending=46)
    with pytest.raises(ValueError, match=r"sweep\.task_items=-1"):
        RunSettings(name="x", task_items=-1)
    with pytest.raises(ValueError, match=r"sweep\.task_ending=0: an integer >= 1"):
        RunSettings(name="x", task_ending=0)


def test_data_without_a_newline_token_is_refused_in_one_line():
    from types import SimpleNamespace

    from scalelab.cli.sweep import _task_set

    settings = RunSettings(name="x", task_items=20, task_ending=8)
    assert _task_set(RunSettings(name="x"), None) is None  # no task: nothing asked of the data
    seq2seq = SimpleNamespace(val_tokens=None, prepared_dir=None, block_size=32)
    with pytest.raises(ValueError, match=r"sweep\.task_items needs .* newline token") as e:
        _task_set(settings, seq2seq)
    assert "\n" not in str(e.value)


def test_logprobs_are_the_models_own_and_the_scores_follow_them():
    from scalelab.model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=256, d_model=16, n_layers=1, n_heads=2,
                                    max_seq_len=48)).eval()
    task = ContinuationTask.from_tokens(_tokens(), 10, block=48, n_items=8, ending=12)
    lp = ending_logprobs(model, task, batch=5)  # batches that split an item's choices
    x = torch.from_numpy(task.sequences[3, 2])[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(x[:, :-1]).float(), -1)[0, -12:]
    want = logp.gather(1, x[0, -12:, None]).sum().item()
    assert lp.shape == (8, CHOICES) and lp[3, 2] == pytest.approx(want, rel=1e-5)

    rigged = np.full((8, CHOICES), -30.0)
    rigged[np.arange(8), task.answer] = -12.0  # right on every item, at 1 nat a token
    rigged[0, (task.answer[0] + 1) % CHOICES] = -6.0  # ... but one
    s = task_scores(rigged, task)
    assert s["final/task_acc"] == pytest.approx(7 / 8) and s["final/task_loss"] == pytest.approx(1.0)
    assert s["final/task_acc_se"] == pytest.approx(np.sqrt(7 / 8 / 8 / 8)) and s["final/task_items"] == 8


def _study(acc_of, rng=None) -> pd.DataFrame:
    """Runs at four budgets whose task loss is a line in their loss and accuracy ``acc_of``."""
    loss = np.linspace(2.8, 2.1, 16)
    tl = 0.4 + 1.1 * loss
    acc = acc_of(tl) + (rng.normal(0, 0.004, len(tl)) if rng is not None else 0)
    return pd.DataFrame({"loss": loss, "task_loss": tl, "task_acc": acc,
                         "budget": np.repeat([1e9, 3e9, 1e10, 3e10], 4)})


def test_two_steps_recover_the_line_and_forecast_beyond_the_study():
    def logistic(t):
        return 0.25 + 0.75 / (1 + np.exp(-2.0 * (2.9 - t)))

    tf = fit_task_forecaster(_study(logistic, np.random.default_rng(0)), 0.25, 2000)
    assert tf.line == pytest.approx((0.4, 1.1), abs=1e-6)
    assert tf.best == "logistic" and tf.cv_error["logistic"] < tf.cv_error["linear"]
    f = tf.forecast(1.8, 1.7, 1.9)  # beyond the study's lowest loss, 2.1
    truth = logistic(0.4 + 1.1 * 1.8)
    assert f["task_loss_pred"] == pytest.approx(0.4 + 1.1 * 1.8)
    assert f["task_acc_pred"] == pytest.approx(truth, abs=0.02)
    assert f["task_acc_lo"] < truth < f["task_acc_hi"]
    assert f["task_loss_lo"] < f["task_loss_pred"] < f["task_loss_hi"]


def test_a_linear_relation_picks_the_linear_form_and_few_runs_give_none():
    def line(t):
        return 0.9 - 0.2 * t

    tf = fit_task_forecaster(_study(line), 0.25, 1000)
    assert tf.best == "linear" and tf.cv_error["linear"] < 1e-9
    assert fit_accuracy("linear", [1.0, 2.0], [0.7, 0.5], 0.25)(3.0) == pytest.approx(0.3)
    assert fit_task_forecaster(_study(line).head(MIN_RUNS - 1), 0.25, 1000) is None
    with pytest.raises(ValueError, match="accuracy form 'cubic'"):
        fit_accuracy("cubic", [1.0, 2.0], [0.7, 0.5], 0.25)


def test_the_task_scores_study_and_forecast_runs_but_not_tune_runs(tmp_path):
    """A point with no checkpoint is named (its task score is missing); a tune run is not
    scored at all, so it is not named either."""
    import dataclasses
    import types

    from scalelab.scaling.heldout_scorer import TaskScorer
    from scalelab.scaling.planner import make_plan
    from scalelab.scaling.sweep_spec import FamilyConfig, SweepSpec

    plan = make_plan(SweepSpec(budgets=[2e9], sizes_per_budget=2, size_span=4.0),
                     FamilyConfig(head_dim=8, aspect_ratio=16, max_layers=2),
                     {"vocab_size": 256, "max_seq_len": 32}, 4 * 32, train_tokens=10_000_000)
    main = plan.points[0]
    task = ContinuationTask.from_tokens(_tokens(), 10, block=32, n_items=4, ending=8)
    said: list[str] = []
    scorer = TaskScorer(None, tmp_path, task, said.append)
    child = types.SimpleNamespace(metrics={}, tags={})
    for p in (main, dataclasses.replace(main, stage="forecast"), dataclasses.replace(main, stage="tune")):
        scorer(p, child)
    assert len(said) == 2 and all("no task score" in s for s in said), said
