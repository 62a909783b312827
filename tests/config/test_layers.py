"""The config layer sits below cli/ and scaling/, registers nothing on import, and stays light:
composing a config and failing validation load neither Lightning nor MLflow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from scalelab.config.compose import compose
from scalelab.config.schema import CheckpointSchema, TrainerSchema, register
from scalelab.config.spec import build_spec

SRC = Path(__file__).resolve().parents[2] / "src" / "scalelab"


def _imports(folder: Path) -> dict[str, set[str]]:
    """file -> the scalelab modules it imports (absolute imports, anywhere in the file)."""
    out: dict[str, set[str]] = {}
    files = [folder] if folder.suffix == ".py" else sorted(folder.rglob("*.py"))
    for f in files:
        names: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(f.relative_to(SRC))] = {n for n in names if n.startswith("scalelab")}
    return out


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("config", ("scalelab.cli", "scalelab.scaling")),
    ("scaling", ("scalelab.cli",)),
    ("training", ("scalelab.cli",)),
    ("paths.py", ("scalelab.",)),  # the ground floor
])
def test_no_arrow_runs_back_up(layer: str, forbidden: tuple[str, ...]) -> None:
    bad = {f: sorted(n for n in names if n.startswith(forbidden))
           for f, names in _imports(SRC / layer).items()}
    assert not {f: n for f, n in bad.items() if n}


def test_importing_the_schema_registers_nothing() -> None:
    code = ("import scalelab.config.schema\nfrom omegaconf import OmegaConf\n"
            "from hydra.core.config_store import ConfigStore\n"
            "print(OmegaConf.has_resolver('scalelab.root'), "
            "'train_schema.yaml' in ConfigStore.instance().list('/'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_register_is_idempotent() -> None:
    register()
    register()
    assert compose("train", []).paths.root


def test_composition_and_config_errors_load_no_lightning_or_mlflow(tmp_path: Path) -> None:
    code = f"""
import sys
from scalelab.cli.train import train
from scalelab.config.compose import compose
cfg = compose("train", ["model.n_heads=3", "paths.output_dir={tmp_path / 'run'}"])
try:
    train(cfg)
except ValueError as e:
    assert "n_heads" in str(e), e
else:
    raise SystemExit("no error")
print(sorted(m for m in ("pytorch_lightning", "lightning_fabric", "mlflow") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
    assert not (tmp_path / "run").exists()  # nothing written either


def test_train_help_loads_no_lightning_or_mlflow() -> None:
    code = """
import sys, atexit
atexit.register(lambda: print(sorted(m for m in ("pytorch_lightning", "mlflow") if m in sys.modules)))
sys.argv = ["scalelab-train", "--help"]
from scalelab.cli.train import main
main()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Powered by Hydra" in out.stdout and out.stdout.strip().endswith("[]"), out.stderr


def test_yaml_gives_every_schema_key_a_value() -> None:
    """The schema says MISSING where the YAML is the source: no key may stay missing."""
    from omegaconf import OmegaConf

    for overrides in ([], ["logger=none"], ["trainer=ddp"], ["+experiment=reverse_seq2seq"]):
        assert not OmegaConf.missing_keys(compose("train", overrides)), overrides


def test_run_spec_carries_the_typed_sections() -> None:
    spec = build_spec(compose("train", ["+trainer.max_time=00:00:00:05",
                                        "callbacks.checkpoint.save_best=false"]))
    assert isinstance(spec.trainer, TrainerSchema) and spec.trainer.accelerator == "cpu"
    assert isinstance(spec.callbacks.checkpoint, CheckpointSchema)
    assert spec.callbacks.checkpoint.save_best is False
    assert not hasattr(spec.trainer, "max_time")  # a Lightning extra: cli/trainer_args.py's
    assert spec.seed == 1337 and spec.run_name == "pystdlib_small" and spec.resume is False


def test_the_cli_refuses_a_bad_value_before_loading_lightning_or_mlflow(tmp_path: Path) -> None:
    """Through the console entry point, Hydra job hooks included (torchrun/joblib device set-up
    runs before validation and must stay Lightning-free)."""
    code = f"""
import sys
from scalelab.cli.train import main
sys.argv = ["scalelab-train", "train.val_every=0", "paths.log_dir={tmp_path / 'out'}"]
try:
    main()
except SystemExit as e:
    print("exit", e.code)
print(sorted(m for m in ("pytorch_lightning", "lightning_fabric", "mlflow") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().endswith("exit 2\n[]"), out.stdout + out.stderr
    assert "train.val_every" in out.stdout + out.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no run folder, no log
