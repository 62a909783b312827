"""Our tokenizers (all tiktoken Encodings, data/tokenizers.py) -> a Hugging Face fast tokenizer.

- gpt2 / r50k / cl100k / o200k / trained bpe: byte-level BPE. The merges are recovered from
  the ranks (a token's merge is the split whose halves are both tokens, ordered by rank) and
  ``ignore_merges=True`` makes a word that is itself a token one token, as tiktoken does.
- byte: the same byte-level model with 256 single-byte tokens and no merges.
- char: a BPE model with one token per character and no merges (no byte-level mapping, since
  a multi-byte character is ONE token in our char vocabulary).
Special tokens keep their ids. The result is checked against our encode() on a probe text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from scalelab.data.tokenizers import BOS, EOT, MASK, PAD


@lru_cache(maxsize=1)
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (as in HF's ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def _bytes_str(b: bytes) -> str:
    table = _byte_to_unicode()
    return "".join(table[x] for x in b)


def _merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    found = []
    for token, rank in vocab.items():
        local = [(token[:i], token[i:], rank) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: m[2])
    return [(a, b) for a, b, _ in found]


def _oniguruma(pattern: str) -> str:
    """tiktoken's regex for HF's Oniguruma engine: there ``{1,3}+`` means "repeat {1,3} one or
    more times", not a possessive {1,3}; a plain {1,3} matches the same pieces here."""
    return re.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", pattern)


def build_hf_tokenizer(tok: Any) -> Any:
    """A ``tokenizers.Tokenizer`` that encodes like ``tok`` (our Tokenizer)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    enc = tok.enc
    specials: dict[str, int] = dict(enc._special_tokens)
    if tok.name == "char":
        vocab = {b.decode("utf-8"): r for b, r in enc._mergeable_ranks.items()}
        vocab.update(specials)
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
        hf.decoder = decoders.Fuse()
    else:
        vocab = {_bytes_str(b): r for b, r in enc._mergeable_ranks.items()}
        merges = _merges(vocab)
        vocab.update(specials)
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        if tok.name == "byte":  # no merges: any split gives the same ids
            hf.pre_tokenizer = byte_level
        else:
            hf.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_oniguruma(enc._pat_str)), behavior="isolated",
                                     invert=False),
                byte_level])
        hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False)
                           for s, _ in sorted(specials.items(), key=lambda kv: kv[1])])
    return hf


PROBE = ("Hello, world! It's 2026 -- naïve café, 東京.\n\tdef f(x):\n        return x**2  # ok\n"
         "  spaces   and\r\nnewlines\n\n")


def save_hf_tokenizer(tok: Any, out: Any, model_max_length: int) -> None:
    """Write tokenizer.json + tokenizer_config.json into ``out``; verify ids on a probe text."""
    from transformers import PreTrainedTokenizerFast

    hf = build_hf_tokenizer(tok)
    probe = PROBE
    if tok.name == "char":  # the char vocabulary only knows its corpus's characters
        probe = "".join(c for c in PROBE if c in (tok.chars or ""))
    ours, theirs = tok.encode(probe), hf.encode(probe).ids
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                     min(len(ours), len(theirs)))
        raise ValueError(f"tokenizer {tok.name!r}: the Hugging Face conversion encodes differently "
                         f"from token {first} on (ours {ours[first:first + 5]}, "
                         f"theirs {theirs[first:first + 5]})")
    fast = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token=EOT, pad_token=PAD,
                                   mask_token=MASK, bos_token=BOS, unk_token=None,
                                   model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(out))
