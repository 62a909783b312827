"""The sweep's shared training overrides against the keys each point's config sets.

Every point run gets the shared overrides on its command line and its own values from its point
config (``+sweep_point=<point>``). Hydra applies command-line key overrides after the config
groups, so a shared override of a key the point sets would silently win over the plan: an
``optim.lr=1e-3`` would train every point at one lr while the tune stage's law is recorded.

- Keys whose planned value derives from the base config (the global batch, the seed, the store)
  take the user's value through ``resolve_base``; they are dropped from the point runs' command
  line.
- Keys a point sets harmlessly (a progress bar) stay free.
- Any other key the plan sets is refused, with the ``sweep.*`` setting that controls it.
"""

from __future__ import annotations

from collections.abc import Iterable

# the plan reads these from the base config and sets each point's own value from them
# (trainer.log_every_n_steps: the base value is the floor of the point's, see sweep.log_points)
BASE_KEYS = frozenset({"train.global_batch_size", "seed", "logger.tracking_uri",
                       "trainer.log_every_n_steps"})
# set by each point, but a user's value for every run changes nothing the study records
FREE_KEYS = frozenset({"trainer.enable_progress_bar", "callbacks.checkpoint.save_best",
                       "logger.backend"})
HINTS = {
    "optim.lr": "set sweep.lr with sweep.lr_rule=fixed (one lr for every size), sweep.lr_law, "
                "or let the tune stage fit it (sweep.tune_lr_factors)",
    "optim.beta2": "set sweep.beta2, or let the tune stage choose it (sweep.tune_beta2s)",
    "optim.warmup_steps": "set sweep.warmup_tokens_per_param or sweep.max_warmup_fraction",
    "optim.min_lr_ratio": "set sweep.min_lr_ratio",
    "optim.schedule": "set sweep.wsd=true for WSD (the default is cosine)",
    "optim.decay_fraction": "set sweep.wsd_decay_fraction",
    "train.max_steps": "the plan sets each point's steps from its budget: set sweep.budgets",
    "train.max_tokens": "the plan sets each point's D: set sweep.budgets or sweep.tokens_per_param",
    "trainer.max_steps": "the plan sets each point's steps from its budget: set sweep.budgets",
    "train.val_every": "set sweep.val_evals (validations per run)",
    "train.val_batches": "set sweep.val_batches",
    "logger.experiment_name": "set sweep.experiment_name",
    "paths.output_dir": "set sweep.output_dir (each point runs in <sweep>/runs/<point>)",
    "trainer.precision": "on a CPU a sweep trains every point in one precision, fp32 for auto: "
                         "set trainer.precision=32-true or bf16-mixed",
}
MODEL_HINT = ("the plan sets each point's shape: set sweep.family.* (docs/sweeps.md), or give "
              "a comma list (model.key=a,b) for a variant axis")


def override_key(text: str) -> str:
    """The dotted key (or config group) an override sets: ``++optim.lr=1`` -> ``optim.lr``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(text).key_or_group


def shared_train_overrides(train_overrides: list[str]) -> list[str]:
    """The sweep's training overrides as the point runs get them: without the keys each point's
    config sets from the base config (on the command line they would win over the point's)."""
    return [o for o in train_overrides if override_key(o) not in BASE_KEYS]


def check_shared_overrides(train_overrides: list[str], point_keys: Iterable[str]) -> None:
    """Refuse, in one line, a shared training override of a key the plan sets per point."""
    planned = set(point_keys) - BASE_KEYS - FREE_KEYS
    for text in train_overrides:
        key = override_key(text)
        if key not in planned:
            continue
        hint = MODEL_HINT if key.startswith("model.") else HINTS.get(
            key, "the sweep sets it for every point; leave it out")
        raise ValueError(f"{text}: a sweep sets {key} per point, so this override would "
                         f"silently replace the planned values; {hint}")
