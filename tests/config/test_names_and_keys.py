"""run_name is a folder-safe name (checked like sweep.name), any value is written back into a
Hydra override exactly, and `+group.key` with an unknown key is refused naming the valid keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from scalelab.config.compose import compose
from scalelab.config.names import MAX_RUN_NAME, folder_stem, hydra_quoted, run_name_problem
from scalelab.config.run_dir import run_dir_resolver
from scalelab.config.spec import build_spec
from scalelab.config.user_conf import check_user_config_folders


@pytest.mark.parametrize(("name", "needle"), [
    ("../../../../x", "no '..'"), ("a/b", "no '/'"), (".hidden", "not starting with a dot"),
    ("x" * 300, "300 characters long: at most 200"), ("", "empty"), ("a\nb", "control"),
])
def test_unsafe_run_names_are_refused(name: str, needle: str) -> None:
    problem = run_name_problem(name)
    assert problem is not None and needle in problem
    assert run_name_problem(folder_stem(name) or "run") is None  # the multirun folder stays safe


@pytest.mark.parametrize("name", ["a,b c\"d'e", "x=y[z]{w}", "café ☕", "$HOME ${oops}", "a" * 200])
def test_other_characters_are_kept(name: str) -> None:
    assert run_name_problem(name) is None and folder_stem(name) == name
    assert MAX_RUN_NAME == 200


def test_a_refused_run_name_makes_no_folder_outside_the_log_dir(tmp_path: Path) -> None:
    log_dir = tmp_path / "outputs"
    scratch = Path(run_dir_resolver(None, False, str(log_dir), "../../escaped", "d", "t"))
    assert scratch.name.startswith("scalelab-unusable-run-dir-")  # its error is raised in the task
    assert not (tmp_path / "escaped").exists() and not list(tmp_path.parent.glob("t_escaped*"))


@pytest.mark.parametrize("value", ["/r/12-00-00_a,b c\"d'e", "a\\", "a\\'b", "${x} \\${y}", "[1,2]=3"])
def test_hydra_quoted_values_parse_back_exactly(value: str) -> None:
    parsed = OverridesParser.create().parse_override(f"paths.output_dir={hydra_quoted(value)}")
    assert OmegaConf.create({"v": parsed.value()}).v == value


@pytest.mark.parametrize(("override", "needle"), [
    ("+train.max_step=5", "train.max_step: no such key in train"),
    ("+callbacks.checkpoint.evry_n_steps=3", "callbacks.checkpoint.evry_n_steps: no such key"),
    ("+logger.trackin_uri=x", "logger.trackin_uri: no such key in logger"),
])
def test_unknown_plus_keys_are_refused_with_the_valid_keys(override: str, needle: str) -> None:
    with pytest.raises(ValueError, match="valid keys") as e:
        build_spec(compose("train", [override]))
    assert needle in str(e.value)


def test_lightning_arguments_and_user_callbacks_stay_open() -> None:
    spec = build_spec(compose("train", ["+trainer.gradient_clip_val=1.0", "callbacks=early_stopping"]))
    assert spec.train.max_steps is None  # still the default


@pytest.mark.parametrize(("text", "needle"), [
    ("defaults:\n  - nano\nn_layers: [8\n", "bad.yaml line"),
    ("n_layers: 8\nn_layers: 9\n", "found duplicate key n_layers"),
])
def test_a_broken_yaml_in_a_user_config_folder_is_one_line(tmp_path: Path, text: str,
                                                           needle: str) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "bad.yaml").write_text(text)
    with pytest.raises(ValueError) as e:
        check_user_config_folders([f"hydra.searchpath=[file://{tmp_path}]"])
    assert needle in str(e.value) and "\n" not in str(e.value)
