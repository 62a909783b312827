"""Text sources: each returns a Corpus (documents in a deterministic order + a fingerprint)."""

from __future__ import annotations

import codecs
import glob as globlib
import hashlib
import os
import sys
import sysconfig
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.data.config import DataConfig
from scalelab.data.files import atomic_write_bytes

SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
# Directories skipped in the stdlib: installed packages are not "the stdlib", and caches.
STDLIB_EXCLUDE = {"site-packages", "dist-packages", "__pycache__"}


@dataclass
class Corpus:
    docs: list[str]
    names: list[str]
    source: str  # human description, e.g. "pystdlib /usr/lib/python3.11 (1790 files)"
    fingerprint: str
    n_bytes: int = 0  # UTF-8 bytes read (before decoding)
    bad_bytes: int = 0  # bytes that were not valid UTF-8 (replaced or dropped)
    bad_files: list[str] = field(default_factory=list)


class _Decoder:
    """UTF-8 decoding with the configured policy; counts the bad bytes."""

    def __init__(self, policy: str):
        self.policy = policy
        self.bad = 0
        self.bad_files: list[str] = []

    def decode(self, raw: bytes, name: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if self.policy == "strict":
                raise ValueError(
                    f"{name}: byte {e.start} is not valid UTF-8 ({e.reason}); fix the file or set "
                    f"data.encoding_errors=replace (U+FFFD) or data.encoding_errors=ignore (drop)"
                ) from e
        n = 0

        def handler(err: UnicodeDecodeError) -> tuple[str, int]:
            nonlocal n
            n += err.end - err.start
            return ("\ufffd" if self.policy == "replace" else "", err.end)

        codecs.register_error("scalelab_count", handler)
        text = raw.decode("utf-8", errors="scalelab_count")
        self.bad += n
        self.bad_files.append(name)
        return text


def _cut_utf8(raw: bytes, n: int) -> bytes:
    """raw[:n], moved back so that no UTF-8 character is cut in half."""
    raw = raw[:n]
    for k in range(1, min(4, len(raw)) + 1):
        b = raw[-k]
        if b & 0xC0 != 0x80:  # found the lead (or ASCII) byte of the last character
            need = 1 if b < 0x80 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return raw if need <= k else raw[:-k]
    return raw


def _as_corpus(cfg: DataConfig, raws: list[tuple[str, bytes]], source: str) -> Corpus:
    if cfg.max_bytes is not None:
        kept, total = [], 0
        for name, raw in raws:
            if total >= cfg.max_bytes:
                break
            if len(raw) > cfg.max_bytes - total:
                raw = _cut_utf8(raw, cfg.max_bytes - total)
            kept.append((name, raw))
            total += len(raw)
        raws = kept
    h = hashlib.sha256()
    for name, raw in raws:
        h.update(name.encode("utf-8", "surrogateescape") + b"\0")
        h.update(hashlib.sha256(raw).digest())
    dec = _Decoder(cfg.encoding_errors)
    docs = [dec.decode(raw, name) for name, raw in raws]
    pairs = [(n, d) for n, d in zip([n for n, _ in raws], docs, strict=True) if d]
    if not pairs:
        raise ValueError(
            f"data.name={cfg.name}: the corpus is empty ({source}); point the data config at "
            f"files with text in them"
        )
    return Corpus(
        docs=[d for _, d in pairs],
        names=[n for n, _ in pairs],
        source=source,
        fingerprint=h.hexdigest(),
        n_bytes=sum(len(r) for _, r in raws),
        bad_bytes=dec.bad,
        bad_files=dec.bad_files,
    )


def _read(path: Path, key: str) -> bytes:
    if not path.exists():
        raise FileNotFoundError(f"{key}={str(path)!r} does not exist; fix the path")
    if path.is_dir():
        raise ValueError(f"{key}={str(path)!r} is a directory; give a file")
    return path.read_bytes()


def stdlib_files() -> tuple[Path, list[Path]]:
    """The stdlib's .py files, sorted by relative path (installed packages pruned early)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rels: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDE]
        rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rels += [f if rel == "." else f"{rel}/{f}" for f in filenames if f.endswith(".py")]
    return root, [root / r for r in sorted(rels)]


def load_pystdlib(cfg: DataConfig) -> Corpus:
    root, files = stdlib_files()
    raws = []
    total = 0
    for p in files:
        if cfg.max_bytes is not None and total >= cfg.max_bytes:
            break  # don't read what max_bytes would drop anyway
        raw = p.read_bytes()
        total += len(raw)
        raws.append((p.relative_to(root).as_posix(), raw))  # same order as the sorted names
    c = _as_corpus(cfg, raws, f"pystdlib {root} ({len(raws)} .py files)")
    # Python version is part of the fingerprint: another Python = another corpus.
    c.fingerprint = hashlib.sha256(f"{sys.version}\0{c.fingerprint}".encode()).hexdigest()
    return c


def download(url: str, dest: Path, sha256: str | None, timeout: float, key: str) -> None:
    """Download once to ``dest`` (atomically), checking sha256; fail fast offline."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            raw = r.read()
    except OSError as e:  # an OSError again, so the CLI reports it in one line
        raise ConnectionError(
            f"could not download {url} within {timeout:g} s ({e}); offline? Download it "
            f"elsewhere and set {key}=/path/to/file"
        ) from e
    got = hashlib.sha256(raw).hexdigest()
    if sha256 and got != sha256:
        raise ValueError(f"{url}: sha256 {got} != expected {sha256}; the download is corrupt")
    atomic_write_bytes(dest, raw)


def load_shakespeare(cfg: DataConfig, download_dir: Path | None) -> Corpus:
    if cfg.path:
        p = Path(cfg.path).expanduser()
        raw = _read(p, "data.path")
    else:
        url = cfg.url or SHAKESPEARE_URL
        sha = cfg.sha256 or (SHAKESPEARE_SHA256 if url == SHAKESPEARE_URL else None)
        dest = (download_dir or Path(".")) / "downloads" / "tinyshakespeare.txt"
        if not dest.exists():
            download(url, dest, sha, cfg.download_timeout, "data.path")
        p, raw = dest, dest.read_bytes()
    if cfg.sha256 and hashlib.sha256(raw).hexdigest() != cfg.sha256:
        raise ValueError(
            f"{p}: sha256 does not match data.sha256={cfg.sha256}; use the right file or set "
            f"data.sha256=null"
        )
    return _as_corpus(cfg, [(p.name, raw)], f"shakespeare {p}")


def resolve_paths(patterns: list[str], file_glob: str) -> list[Path]:
    out: list[Path] = []
    for pat in patterns:
        p = Path(os.path.expanduser(pat))
        if any(ch in pat for ch in "*?["):
            hits = sorted(Path(h) for h in globlib.glob(os.path.expanduser(pat), recursive=True))
            hits = [h for h in hits if h.is_file()]
            if not hits:
                raise FileNotFoundError(f"data.paths: the glob {pat!r} matches no file; fix it")
            out += hits
        elif p.is_dir():
            hits = sorted(h for h in p.glob(file_glob) if h.is_file())
            if not hits:
                raise FileNotFoundError(
                    f"data.paths: directory {pat!r} has no file matching data.glob={file_glob!r}"
                )
            out += hits
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"data.paths: {pat!r} does not exist; fix the path")
    return out


def load_text_files(cfg: DataConfig) -> Corpus:
    files = resolve_paths(list(cfg.paths or []), cfg.glob)
    raws = []
    for p in files:
        raws.append((str(p), p.read_bytes()))
    return _as_corpus(cfg, raws, f"text_files ({len(files)} files)")


def load_hf(cfg: DataConfig) -> Corpus:
    try:
        import datasets
    except ImportError as e:
        raise RuntimeError(
            "data.name=hf needs the optional 'datasets' package: pip install -e '.[hf]'"
        ) from e
    kwargs = {}
    if cfg.paths:
        kwargs["data_files"] = [str(Path(p).expanduser()) for p in cfg.paths]
        for p in kwargs["data_files"]:
            if not Path(p).exists():
                raise FileNotFoundError(f"data.paths: {p!r} does not exist; fix the path")
    ds = datasets.load_dataset(
        cfg.hf_name, cfg.hf_config, split=cfg.hf_split, streaming=cfg.streaming, **kwargs
    )
    raws = []
    total = 0
    for i, row in enumerate(ds):
        if cfg.text_column not in row:
            raise ValueError(
                f"data.text_column={cfg.text_column!r} is not a column of {cfg.hf_name}; "
                f"columns: {sorted(row)}"
            )
        raw = str(row[cfg.text_column]).encode("utf-8")
        raws.append((f"{cfg.hf_name}[{i}]", raw))
        total += len(raw)
        if cfg.max_bytes is not None and total >= cfg.max_bytes:
            break
    desc = f"hf {cfg.hf_name}/{cfg.hf_config or '-'} split={cfg.hf_split}"
    return _as_corpus(cfg, raws, desc)


def load_corpus(cfg: DataConfig, download_dir: Path | None = None) -> Corpus:
    if cfg.name == "pystdlib":
        return load_pystdlib(cfg)
    if cfg.name == "shakespeare":
        return load_shakespeare(cfg, download_dir)
    if cfg.name == "text_files":
        return load_text_files(cfg)
    if cfg.name == "hf":
        return load_hf(cfg)
    raise ValueError(
        f"data.name={cfg.name} is a seq2seq source: use Seq2SeqDataModule(data_cfg, ...) "
        f"instead of prepare()"
    )
