"""Fixtures for the data tests: small real corpora, prepared once per session."""

from pathlib import Path

import pytest

from scalelab.data import DataConfig, PreparedData, TokenizerConfig, prepare


@pytest.fixture(scope="session")
def shakespeare_path(shared_data_dir: Path) -> str:
    return str(shared_data_dir / "tinyshakespeare.txt")


@pytest.fixture(scope="session")
def shakespeare_char(
    shakespeare_path: str, tmp_path_factory: pytest.TempPathFactory
) -> PreparedData:
    cache = tmp_path_factory.mktemp("cache")
    return prepare(
        DataConfig(name="shakespeare", path=shakespeare_path),
        TokenizerConfig(name="char"),
        cache,
        progress=False,
    )


@pytest.fixture(scope="session")
def shakespeare_bpe(
    shakespeare_path: str, tmp_path_factory: pytest.TempPathFactory
) -> PreparedData:
    cache = tmp_path_factory.mktemp("cache")
    return prepare(
        DataConfig(name="shakespeare", path=shakespeare_path),
        TokenizerConfig(name="bpe", vocab_size=512),
        cache,
        progress=False,
    )


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
