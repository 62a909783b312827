"""The docs stay short, link to files that exist, and the repository reads as a product.

The last part greps the shipped text (README, docs, sources, tests, benchmarks, the Hydra
configs) for the words a development log leaves behind: session counts, "this host", dated
headings, commit hashes cited in prose, issue numbers. Such text goes stale the day it is
written and tells a user nothing about what the code does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_LINES = {"README.md": 200, "docs/performance.md": 300}
IMG_BUDGET_BYTES = 2 * 1024 * 1024

ORDINALS = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
    r"(?:twenty|thirty|forty)(?:-(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth))?|"
    r"twentieth|thirtieth|fortieth|\d+(?:st|nd|rd|th)|earlier|later|previous|last|next|this|"
    r"that|same|each|every|one"
)
# Each pattern marks development history. "session" alone is left alone on purpose: MLflow and
# SQLAlchemy sessions and `setsid`'s new session are real words of the code.
HISTORY = {
    "ordinal session": re.compile(rf"\b(?:{ORDINALS})\s+(?:session|sitting)s?\b", re.I),
    "session count": re.compile(r"\bsessions?\s+\d+(?:\s*[-–]\s*\d+)?\b", re.I),
    "sitting": re.compile(r"\bsittings?\b", re.I),
    # code says "this host" for pids and host tags; only the docs use it for a measuring machine
    "this host": re.compile(r"\b(?:that|same|today's) host\b", re.I),
    # ... and in the docs "runs on this host" / "runs of this host whose process" is about pids too
    "this host (docs)": re.compile(r"(?<!runs on )\bthis host\b(?! whose)", re.I),
    "issue number": re.compile(r"\bissue[ -]#?\d+\b", re.I),
    "dated heading": re.compile(r"^#+ .*\b20\d\d-\d\d-\d\d", re.M),
    "commit hash": re.compile(
        r"(?:\b(?:at|commit|since|in|before|after|until)\s+`?|\(`?)[0-9a-f]{7,40}\b"
        r"(?=`?[\s),.;:]|$)", re.M),
}
MARKDOWN_ONLY = {"this host (docs)", "dated heading"}  # a `#` line of Python/YAML is a comment
# A commit-hash-like word that is not one: hex digests and ids the text quotes on purpose.
HEX_ALLOW = re.compile(r"^(?:[0-9]+|[0-9a-f]*[g-z].*)$")


def text_files() -> list[Path]:
    """README, every doc, and the code, tests, benchmarks and Hydra configs that ship."""
    out = [README, *sorted(DOCS.rglob("*.md"))]
    for folder, suffixes in (("src", {".py", ".yaml", ".md"}), ("tests", {".py"}),
                             ("benchmarks", {".py", ".md"})):
        out += sorted(p for p in (REPO / folder).rglob("*")
                      if p.suffix in suffixes and p.is_file() and "__pycache__" not in p.parts)
    this = Path(__file__).resolve()
    return [p for p in out if p.resolve() != this]


def history_hits(path: Path) -> list[str]:
    """`file:line: [kind] text` for every line of `path` that reads like a development log."""
    hits = []
    text = path.read_text(errors="replace")
    for kind, pattern in HISTORY.items():
        if kind in MARKDOWN_ONLY and path.suffix != ".md":
            continue
        for m in pattern.finditer(text):
            if kind == "commit hash":
                word = re.search(r"[0-9a-f]{7,40}", m.group(0)).group(0)
                if HEX_ALLOW.match(word) or not re.search(r"\d", word) or not re.search(
                        r"[a-f]", word):
                    continue
            line_no = text.count("\n", 0, m.start()) + 1
            hits.append(f"{path.relative_to(REPO)}:{line_no}: [{kind}] {m.group(0).strip()}")
    return hits


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("name", sorted(MAX_LINES))
def test_doc_is_short(name: str) -> None:
    lines = (REPO / name).read_text().count("\n")
    assert lines <= MAX_LINES[name], f"{name}: {lines} lines, at most {MAX_LINES[name]}"


def test_docs_img_is_small() -> None:
    size = sum(p.stat().st_size for p in (DOCS / "img").rglob("*") if p.is_file())
    assert size <= IMG_BUDGET_BYTES, f"docs/img holds {size / 2**20:.2f} MiB, at most 2 MiB"


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files(md: Path) -> None:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)  # commands are not links
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (md.parent / path).exists():
            broken.append(target)
    assert not broken, f"{md.relative_to(REPO)}: links to missing files: {broken}"


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_anchors_between_docs_exist(md: Path) -> None:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", text):
        path, anchor = target.split("#", 1)
        doc = (md.parent / path) if path else md
        if doc.suffix == ".md" and doc.exists() and anchor not in github_anchors(doc):
            broken.append(target)
    assert not broken, f"{md.relative_to(REPO)}: links to missing headings: {broken}"


def github_anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives the headings of `doc` (lower case, punctuation dropped)."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("path", text_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_development_history(path: Path) -> None:
    hits = history_hits(path)
    assert not hits, "development history; say what the code does instead:\n" + "\n".join(hits)


def test_the_history_patterns_catch_what_they_are_for() -> None:
    samples = {
        "ordinal session": "measured in the thirty-fifth session",
        "sitting": "over four sittings",
        "this host": "on the same host the bench read 0.98",
        "this host (docs)": "On this host the bench read 0.98",
        "issue number": "the issue 9 goal",
        "dated heading": "### 2026-12-06, a run",
        "commit hash": "the same command at c227b39 exited 1",
    }
    for kind, sample in samples.items():
        assert HISTORY[kind].search(sample), kind
    for fine in ("an MLflow session", "setsid starts a new session", "SQLAlchemy's Session",
                 "`sha256` of deadbeef00", "the run id 65d5f570ff1949cba414a97121cab39c"):
        assert not any(p.search(fine) for p in HISTORY.values()), fine
