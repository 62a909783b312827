"""The data/tokenizer config groups compose inside the real conf/train.yaml."""

from pathlib import Path

import pytest

from scalelab.data import DataConfig, TokenizerConfig

CONF = Path(__file__).resolve().parents[2] / "src" / "scalelab" / "conf"


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    import scalelab.cli.data  # noqa: F401  (registers the schema / resolvers train.yaml uses)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


@pytest.mark.parametrize(
    "data", sorted(p.stem for p in (CONF / "data").glob("*.yaml") if p.stem != "shakespeare_char")
)
def test_every_data_config_composes_and_validates(data):
    from omegaconf import OmegaConf

    c = _compose([f"data={data}"])
    DataConfig(**OmegaConf.to_container(c.data, resolve=True))
    TokenizerConfig(**OmegaConf.to_container(c.tokenizer, resolve=True))


def test_shakespeare_char_selects_char_tokenizer():
    from hydra.errors import ConfigCompositionException

    try:
        c = _compose(["data=shakespeare_char", "tokenizer=bpe"])
        assert c.tokenizer.name == "bpe"  # the command line still wins
        c = _compose(["data=shakespeare_char"])
    except ConfigCompositionException as e:
        pytest.fail(
            f"data=shakespeare_char overrides the tokenizer group; Hydra only allows that when "
            f"'tokenizer' comes BEFORE 'data' in conf/train.yaml's defaults list ({e})"
        )
    assert (c.data.name, c.tokenizer.name, c.data.val_fraction) == ("shakespeare", "char", 0.1)


def test_cli_run_prepares_and_reports_bad_paths(tmp_path, shakespeare_path, capsys):
    from scalelab.cli.data import run

    base = [f"paths.data_dir={tmp_path}", "data=shakespeare", "tokenizer=char"]
    assert run(_compose([*base, f"data.path={shakespeare_path}", "data.max_bytes=100000"])) == 0
    assert "tokenizer char vocab" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
        run(_compose([*base, f"data.path={tmp_path}/missing.txt"]))
    assert run(_compose([*base, "data=synthetic_seq2seq"])) == 0
