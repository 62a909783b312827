from __future__ import annotations

import pytest

from scalelab.training import derive_batch, steps_from_budget


def test_sequences_no_micro() -> None:
    plan = derive_batch(12, None, 1, 64, "sequences")
    assert plan == (12, 1, 12, 12 * 64)
    assert plan.micro_batch == 12 and plan.grad_accum == 1


def test_micro_batch_gives_accumulation() -> None:
    plan = derive_batch(64, 8, 2, 128, "sequences")
    assert (plan.micro_batch, plan.grad_accum, plan.global_batch_sequences) == (8, 4, 64)
    assert plan.tokens_per_step == 64 * 128


def test_global_batch_fixed_across_device_counts() -> None:
    plans = [derive_batch(32, 4, w, 16, "sequences") for w in (1, 2, 4, 8)]
    assert [p.grad_accum for p in plans] == [8, 4, 2, 1]
    assert {p.tokens_per_step for p in plans} == {32 * 16}
    assert all(p.micro_batch * p.grad_accum * w == 32 for p, w in zip(plans, (1, 2, 4, 8), strict=True))


def test_tokens_unit() -> None:
    plan = derive_batch(524288, 16, 8, 1024, "tokens")  # GPT-2: 0.5M tokens per step
    assert plan.global_batch_sequences == 512
    assert plan.grad_accum == 4 and plan.tokens_per_step == 524288


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ((1000, None, 1, 64, "tokens"), "not a multiple of block_size=64"),
        ((10, None, 4, 64, "sequences"), "does not split over 4 devices"),
        ((12, 5, 1, 64, "sequences"), r"micro_batch_size \(5\) x devices \(1\)"),
        ((16, 4, 3, 64, "sequences"), r"x devices \(3\) = 12"),
        ((16, None, 1, 64, "rows"), "choose 'sequences' or 'tokens'"),
        ((0, None, 1, 64, "sequences"), "global_batch_size=0"),
        ((16, 0, 1, 64, "sequences"), "micro_batch_size=0"),
    ],
)
def test_errors(args: tuple, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        derive_batch(*args)


def test_steps_from_budget() -> None:
    assert steps_from_budget(1_000_000, 1000) == 1000
    assert steps_from_budget(1_000_001, 1000) == 1001  # at least the budget
    assert steps_from_budget(1e6, 1000) == 1000  # Hydra may pass 1e6 as a float
    with pytest.raises(ValueError, match="max_tokens"):
        steps_from_budget(0, 10)
    with pytest.raises(ValueError, match="tokens_per_step"):
        steps_from_budget(10, 0)
