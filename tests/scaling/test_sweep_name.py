"""sweep.name names the folder sweeps/<name>: it may not climb out of sweeps/ or hide in it."""

from __future__ import annotations

import pytest

from scalelab.scaling.sweep_settings import RunSettings


@pytest.mark.parametrize("name", ["../../x", "..", ".", ".hidden", "a/b", "a\\b", ""])
def test_unsafe_sweep_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match=r"sweep\.name"):
        RunSettings(name=name)


def test_ordinary_names_pass() -> None:
    assert RunSettings(name="lr_3e-4.v2").name == "lr_3e-4.v2"
