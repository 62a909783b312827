"""Model presets: presets.py is the one source; conf/model/*.yaml are generated from it, list
only what differs (Hydra defaults from a family base) and compose to the same configs."""

from __future__ import annotations

from pathlib import Path

import pytest

import scalelab
from scalelab.model import ModelConfig
from scalelab.model.presets import FAMILIES, PRESETS, preset, preset_dict, preset_files

CONF_MODEL = Path(scalelab.__file__).parent / "conf" / "model"

# Recorded before the presets became inheriting YAML (vocab_size null -> 65, char-level):
# N, N non-embedding, N matmul. gpt2, llama_7b and gpt3 are the published shapes.
EXPECTED_N = {
    "gpt2": (124_439_808, 85_056_000, 123_653_376),
    "nano": (809_856, 793_344, 801_664),
    "gpt2_tiny": (108_352, 100_096, 104_256),
    "llama_tiny": (755_072, 738_432, 746_752),
    "llama_7b": (6_738_415_616, 6_476_271_616, 6_607_343_616),
    "gpt3": (174_604_259_328, 173_961_535_488, 174_579_093_504),
    "bert_tiny": (421_248, 396_544, 404_864),
    "bert_base": (85_497_600, 85_054_464, 85_104_384),
    "transformer_base": (44_171_776, 44_138_496, 44_171_776),
    "transformer_tiny": (237_632, 233_472, 237_632),
}


def test_every_preset_has_a_recorded_n() -> None:
    assert set(EXPECTED_N) == set(PRESETS)
    for name, expected in EXPECTED_N.items():
        cfg = preset(name, vocab_size=preset_dict(name)["vocab_size"] or 65)
        assert (cfg.n_params(), cfg.n_params(non_embedding=True), cfg.n_params_matmul()) \
            == expected, name


def test_yaml_files_are_generated_from_presets_py() -> None:
    """Fix: python -m scalelab.model --write-presets src/scalelab/conf/model"""
    on_disk = {str(p.relative_to(CONF_MODEL)): p.read_text() for p in CONF_MODEL.rglob("*.yaml")}
    assert on_disk == preset_files()


def test_yaml_lists_only_what_differs() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    defaults = ModelConfig()._given
    for name in FAMILIES:
        loaded = omegaconf.OmegaConf.load(CONF_MODEL / "family" / f"{name}.yaml") or {}
        assert all(loaded[k] != defaults[k] for k in loaded), name
    for name, p in PRESETS.items():
        loaded = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(CONF_MODEL / f"{name}.yaml"))
        assert loaded.pop("defaults") == [f"family/{p.family}@_here_", "_self_"]
        base = defaults | FAMILIES[p.family].fields
        assert all(loaded[k] != base[k] for k in loaded), name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_yaml_preset_composes_to_the_python_preset(name: str) -> None:
    """Hydra's compose API, model group alone; unlisted fields come from the dataclass."""
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_MODEL.parent), version_base="1.3"):
        cfg = compose(overrides=[f"+model={name}"])
    GlobalHydra.instance().clear()
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg.model)  # typed: int | None
    assert OmegaConf.to_container(merged) == preset_dict(name)


def test_write_presets_cli_writes_the_files(tmp_path: Path) -> None:
    from scalelab.model.__main__ import main

    assert main(["--write-presets", str(tmp_path)]) == 0
    written = {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*.yaml")}
    assert written == preset_files()


# Published parameter counts of the presets that carry the published shape and vocabulary:
# GPT-2 small and Llama-1 7B exactly (Hugging Face's gpt2 / Llama-7B checkpoints count the
# same tensors), GPT-3 as the paper's rounded "175.0B" (Brown et al. 2020, table 2.1).
PUBLISHED = {"gpt2": (124_439_808, 0.0), "llama_7b": (6_738_415_616, 0.0),
             "gpt3": (175.0e9, 0.005)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_at_its_size(name: str) -> None:
    """The real module of every preset, built on torch's meta device (shapes without memory:
    gpt3 would need 700 GB), has the recorded N and, where published, the published N; one
    forward pass on meta checks that its layers connect (up to 32 layers). The tiny presets also train for a few
    steps (tests/cli/test_experiments_smoke.py); the large ones cannot on a CPU."""
    import torch

    from scalelab.model import Transformer

    cfg = preset(name, vocab_size=preset_dict(name)["vocab_size"] or 65)
    with torch.device("meta"):
        model = Transformer(cfg)
        if cfg.n_layers <= 32:  # gpt3's 96 layers (gpt2's code) take seconds even on meta
            ids = torch.zeros(1, 8, dtype=torch.long)
            src = {"src_ids": ids} if cfg.arch == "encoder_decoder" else {}
            assert model(ids, **src).shape == (1, 8, cfg.vocab_size)
    n = sum(p.numel() for p in model.parameters())  # a tied embedding counts once
    assert n == EXPECTED_N[name][0], (name, n)
    if name in PUBLISHED:
        published, rel = PUBLISHED[name]
        assert abs(n - published) <= rel * published, (name, n, published)
