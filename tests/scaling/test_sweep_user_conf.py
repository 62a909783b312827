"""`scalelab-sweep` reads the YAML of a user config folder (``hydra.searchpath=[file://...]``)
before it plans anything: a malformed file is one line naming it, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.cli.sweep import main as sweep_main


def test_a_broken_yaml_in_the_sweeps_user_config_folder_is_one_line_before_any_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("defaults:\n  - nano\nn_layers: [8\n")
    with pytest.raises(SystemExit) as e:
        sweep_main(["--plan-only", "sweep=cpu_tiny", f"hydra.searchpath=[file://{tmp_path}]",
                    "model=mine"])
    out, err = capsys.readouterr()
    assert e.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"{tmp_path / 'model' / 'mine.yaml'} line 4" in err and "fix its YAML" in err
    assert out == ""  # nothing planned
