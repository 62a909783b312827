"""Build docs/lm_eval/pystdlib_mc.jsonl: "which line continues this Python?" from held-out text.

    PYTHONPATH=src python scripts/build_lm_eval_task.py [--n 300] [--seed 0]
The items come from the validation split of data=pystdlib (the split scalelab-train holds out,
by the same rule), never from the training split. Each item cuts a line at a random point: the
context is the text before the cut (at most 48 characters, so it fits a 64-token char model
with the continuation), the right choice is the rest of that line, and the three others are
line endings from elsewhere in the split. The right answer's position is balanced over the four
choices. Only printable ASCII is used, so any of our tokenizers encodes every item.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CONTEXT, MIN_END, MAX_END, N_CHOICES = 48, 6, 16, 4
OUT = Path(__file__).resolve().parents[1] / "docs" / "lm_eval" / "pystdlib_mc.jsonl"


def _printable(s: str) -> bool:
    return all(" " <= c <= "~" or c == "\n" for c in s)


def _candidates(text: str, rng: random.Random) -> list[tuple[str, str]]:
    """(context, line ending) pairs: each line cut at a random point, both parts printable."""
    out = []
    lines = text.split("\n")
    pos = 0
    for line in lines:
        start, pos = pos, pos + len(line) + 1
        body = line.strip()
        if len(body) < MIN_END + 4 or body.startswith("#") or not _printable(line):
            continue
        indent = len(line) - len(line.lstrip())
        cut = rng.randint(indent + 2, max(indent + 2, len(line) - MIN_END))
        ending = line[cut:][:MAX_END]
        context = text[max(0, start + cut - CONTEXT):start + cut]
        if len(ending.strip()) >= MIN_END - 2 and _printable(context) and "\n" in context:
            out.append((context, ending))
    return out


def build(n: int, seed: int) -> list[dict[str, object]]:
    from scalelab.data.config import DataConfig
    from scalelab.data.shards import split_tail
    from scalelab.data.sources import load_corpus

    cfg = DataConfig(name="pystdlib", encoding_errors="replace")
    _, val_docs = split_tail(load_corpus(cfg).docs, float(cfg.val_fraction))
    rng = random.Random(seed)
    pool = [c for doc in val_docs for c in _candidates(doc, rng)]
    rng.shuffle(pool)
    items = []
    endings = [e for _, e in pool]
    for i, (context, ending) in enumerate(pool[:n]):
        others: list[str] = []
        while len(others) < N_CHOICES - 1:
            other = rng.choice(endings)
            if other.strip() != ending.strip() and other not in others:
                others.append(other)
        label = i % N_CHOICES
        choices = [*others[:label], ending, *others[label:]]
        items.append({"context": context, "choices": choices, "label": label})
    if len(items) < n:
        raise SystemExit(f"only {len(items)} items in the validation split; lower --n")
    return items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    items = build(args.n, args.seed)
    OUT.write_text("".join(json.dumps(it) + "\n" for it in items))
    print(f"wrote {len(items)} items to {OUT}")


if __name__ == "__main__":
    main()
