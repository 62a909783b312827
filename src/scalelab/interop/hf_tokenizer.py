"""Our tokenizers (all tiktoken Encodings, data/tokenizers.py) -> a Hugging Face fast tokenizer.

- gpt2 / r50k / cl100k / o200k / trained bpe: byte-level BPE. The merges are recovered from
  the ranks (a token's merge is the split whose halves are both tokens, ordered by rank) and
  ``ignore_merges=True`` makes a word that is itself a token one token, as tiktoken does.
- byte: the same byte-level model with 256 single-byte tokens and no merges.
- char: a BPE model with one token per character and no merges (no byte-level mapping, since
  a multi-byte character is ONE token in our char vocabulary). A character outside the
  vocabulary becomes BPE's unk token: U+FFFD's id when the vocabulary has a count floor (as our
  encode() does), else a name missing from the vocabulary, which makes the tokenizer raise, as
  our encode() does, instead of silently dropping the character.
Special tokens keep their ids. Text that spells a special token is ordinary text on both sides
(we only call encode_ordinary; ``split_special_tokens`` tells transformers the same).
tokenizer_config.json names ``PreTrainedTokenizerFast``, a class transformers 4.x and 5.x both
know. The written folder is loaded back with AutoTokenizer and compared with our encode() and
decode() on probe texts that include unknown characters and special-token spellings.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from scalelab.data.tokenizers import BOS, EOT, MASK, PAD

# BPE's unk token for a char vocabulary without a replacement: not in the vocabulary, so an
# unknown character raises "Unk token `<|char-not-in-vocabulary|>` not found in the vocabulary"
REFUSE_UNK = "<|char-not-in-vocabulary|>"


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
        unk = tok.replacement if tok.replacement is not None else REFUSE_UNK
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True, unk_token=unk))
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
# spelled-out special tokens: ordinary text on both sides
SPECIAL_PROBE = "a <|endoftext|> b<|pad|><|mask|> <|bos|>c <|endoftext"
# characters a small corpus rarely has: a char vocabulary maps them to U+FFFD or refuses them
RARE_CHARS = "Łł\x00\x7f\u200b😀\ufffe\U0010fffd"


def probe_texts(tok: Any) -> list[str]:
    """Texts whose ids must agree: general text, special-token spellings, and, for char, text
    with characters outside the vocabulary (which must map to U+FFFD or be refused)."""
    texts = [PROBE, SPECIAL_PROBE, PROBE + SPECIAL_PROBE + RARE_CHARS]
    if tok.name != "char":
        return texts
    known = [("".join(c for c in t if c in (tok.chars or "")), t) for t in texts]
    unknown = next((c for c in RARE_CHARS if c not in (tok.chars or "")), None)
    out = [k for k, _ in known] + [t for _, t in known]
    if unknown is not None:
        out.append(f"Łukasz{unknown}" + (tok.chars or "")[:40])
    return out


def _ours(tok: Any, text: str) -> tuple[list[int], str] | None:
    """(ids, decoded) by our tokenizer, or None when it refuses the text."""
    try:
        ids = tok.encode(text)
    except ValueError:
        return None
    return ids, tok.decode(ids)


def _theirs(fast: Any, text: str) -> tuple[list[int], str] | None:
    try:
        ids = fast(text, add_special_tokens=False)["input_ids"]
    except Exception:  # tokenizers raises a bare Exception for an unknown char
        return None
    return ids, fast.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def check_round_trip(tok: Any, fast: Any, texts: list[str] | None = None) -> None:
    """ValueError naming the first text where ``fast`` (a transformers tokenizer) and ``tok``
    differ in ids, in decoding, or in refusing the text."""
    for text in probe_texts(tok) if texts is None else texts:
        ours, theirs = _ours(tok, text), _theirs(fast, text)
        if ours == theirs:
            continue
        if ours is None or theirs is None:
            who = "ours refuses it, theirs does not" if ours is None else "theirs refuses it"
            raise ValueError(f"tokenizer {tok.name!r}: the Hugging Face conversion differs on "
                             f"{text[:40]!r}: {who}")
        a, b = ours[0], theirs[0]
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                     min(len(a), len(b)))
        if a == b:
            raise ValueError(f"tokenizer {tok.name!r}: the Hugging Face conversion decodes "
                             f"{text[:40]!r} differently ({ours[1][:40]!r} vs {theirs[1][:40]!r})")
        raise ValueError(f"tokenizer {tok.name!r}: the Hugging Face conversion encodes "
                         f"{text[:40]!r} differently from token {first} on (ours "
                         f"{a[first:first + 5]}, theirs {b[first:first + 5]})")


def save_hf_tokenizer(tok: Any, out: Any, model_max_length: int) -> None:
    """Write tokenizer.json + tokenizer_config.json into ``out``, then load them back with
    AutoTokenizer and check encode and decode against ours on the probe texts."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=build_hf_tokenizer(tok), eos_token=EOT,
                                   pad_token=PAD, mask_token=MASK, bos_token=BOS, unk_token=None,
                                   model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False, split_special_tokens=True)
    fast.save_pretrained(str(out))
    path = Path(out) / "tokenizer_config.json"
    written = json.loads(path.read_text())
    written.update(tokenizer_config_fields())
    path.write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n")
    check_round_trip(tok, AutoTokenizer.from_pretrained(str(out)))


def tokenizer_config_fields() -> dict[str, Any]:
    """tokenizer_config.json entries both transformers 4.x and 5.x read the same way: 5.x
    writes its own class name (TokenizersBackend), which 4.x does not have."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "split_special_tokens": True,
            "clean_up_tokenization_spaces": False}
