"""Whole-model properties: causality, KV cache, enc-dec padding, gradients, init, generate, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scalelab.model import Transformer
from scalelab.model.variants import ARCHS, MLPS, NORM_POSITIONS, NORMS, POSITIONS

from .helpers import tiny

V = 37


def ids(b: int, t: int) -> torch.Tensor:
    return torch.randint(0, V, (b, t))


@pytest.mark.parametrize("position", POSITIONS)
def test_decoder_is_causal_encoder_is_not(position: str) -> None:
    x = ids(2, 10)
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % V  # change the tokens after position 5
    dec = Transformer(tiny(position=position)).eval()
    torch.testing.assert_close(dec(x)[:, :6], dec(y)[:, :6])
    assert (dec(x)[:, 6:] - dec(y)[:, 6:]).abs().max() > 1e-6
    enc = Transformer(tiny(arch="encoder", position=position)).eval()
    # every early position sees the change (small with sinusoidal: PE dwarfs 0.02-std embeddings)
    assert ((enc(x)[:, :6] - enc(y)[:, :6]).abs().amax(-1) > 1e-6).all()


def test_encoder_ignores_padded_positions() -> None:
    enc = Transformer(tiny(arch="encoder", position="alibi")).eval()
    x = ids(2, 10)
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[1, 7:] = False
    y = x.clone()
    y[1, 7:] = (y[1, 7:] + 3) % V
    torch.testing.assert_close(enc(x, attention_mask=keep)[1, :7], enc(y, attention_mask=keep)[1, :7])


@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_model_level_gqa_equals_mha_and_mqa_shapes(n_kv_heads: int) -> None:
    mha = Transformer(tiny()).eval()
    other = Transformer(tiny(n_kv_heads=n_kv_heads)).eval()
    if n_kv_heads == 4:  # n_kv_heads == n_heads is plain MHA: same weights, same logits
        other.load_state_dict(mha.state_dict())
        x = ids(2, 8)
        torch.testing.assert_close(other(x), mha(x))
    else:  # MQA: one K/V head of head_dim for all query heads: q 32 rows, k and v 8 each
        assert other.state_dict()["decoder.blocks.0.self_attn.fn.qkv_proj.weight"].shape == (48, 32)


CACHE_CASES = [
    dict(position=p) for p in POSITIONS
] + [
    dict(position="rope", n_kv_heads=1, norm="rmsnorm", mlp="swiglu", bias=False),
    dict(position="alibi", n_kv_heads=2, norm_position="post"),
    dict(arch="encoder_decoder", position="sinusoidal"),
    dict(arch="encoder_decoder", position="learned", n_kv_heads=2),
    dict(arch="encoder_decoder", position="rope", norm_position="post"),
    dict(arch="encoder_decoder", position="alibi"),
]


@pytest.mark.parametrize("overrides", CACHE_CASES, ids=[str(c) for c in CACHE_CASES])
def test_kv_cache_equals_full_forward(overrides: dict) -> None:
    model = Transformer(tiny(**overrides)).eval()
    x = ids(2, 12)
    kw = {}
    if model.is_seq2seq:
        src_mask = torch.ones(2, 9, dtype=torch.bool)
        src_mask[0, 6:] = False
        kw = dict(src_ids=ids(2, 9), src_mask=src_mask)
    full = model(x, **kw)
    cache = model.new_cache()
    steps = [model(x[:, :5], cache=cache, **kw)]  # prefill 5 tokens, then one at a time
    for t in range(5, 12):
        steps.append(model(x[:, t:t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.offset == 12


def test_enc_dec_source_padding_never_affects_outputs() -> None:
    for position in POSITIONS:
        model = Transformer(tiny(arch="encoder_decoder", position=position)).eval()
        tgt = ids(1, 6)
        src = ids(1, 5)
        short = model(tgt, src_ids=src, src_mask=torch.ones(1, 5, dtype=torch.bool))
        for pad_len in (1, 4):
            padded = torch.cat([src, ids(1, pad_len)], dim=1)  # arbitrary tokens as padding
            mask = torch.cat([torch.ones(1, 5), torch.zeros(1, pad_len)], dim=1).bool()
            torch.testing.assert_close(model(tgt, src_ids=padded, src_mask=mask), short,
                                       atol=1e-5, rtol=1e-4)


def test_enc_dec_shares_one_embedding_for_source_target_and_output() -> None:
    model = Transformer(tiny(arch="encoder_decoder"))
    assert model.lm_head.weight is model.tok_emb.weight
    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    assert len(embeddings) == 2  # token table + learned position table


GRAD_CASES = [
    dict(arch=a, norm=n, norm_position=np_, mlp=m, position=p, bias=b, tie_embeddings=t,
         n_kv_heads=kv, final_norm=fn)
    for i, (a, n, np_, m, p, b, t, kv, fn) in enumerate(
        (a, list(NORMS)[i % len(NORMS)], list(NORM_POSITIONS)[i // 2 % len(NORM_POSITIONS)],
         list(MLPS)[i % len(MLPS)], p, i % 2 == 0, i % 3 == 0,
         (None, 2, 1)[i % 3], (None, True)[i // 3 % 2])
        for a in ARCHS for i, p in enumerate(POSITIONS))
]


@pytest.mark.parametrize("overrides", GRAD_CASES, ids=[f"{c['arch']}-{c['position']}-{c['mlp']}"
                                                       for c in GRAD_CASES])
def test_every_parameter_gets_a_gradient(overrides: dict) -> None:
    model = Transformer(tiny(**overrides, dropout=0.1)).train()
    x = ids(2, 8)
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[1, 6:] = False
    kw = dict(src_ids=ids(2, 7), src_mask=torch.ones(2, 7, dtype=torch.bool)) \
        if model.is_seq2seq else {}
    logits = model(x, attention_mask=keep, **kw)
    F.cross_entropy(logits.flatten(0, 1), ids(2, 8).flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_gpt2_init() -> None:
    cfg = tiny(d_model=256, n_heads=4, n_layers=8, bias=True)
    model = Transformer(cfg)
    block = model.decoder.blocks[0]
    residual_std = 0.02 / math.sqrt(2 * 8)
    assert block.self_attn.fn.qkv_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.self_attn.fn.o_proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert block.mlp.fn.down.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.fn.up.bias.abs().max().item() == 0.0
    assert block.self_attn.norm.weight.eq(1).all()
    flat = Transformer(tiny(d_model=256, n_heads=4, n_layers=8, scale_residual_init=False,
                            init_std=0.05))
    assert flat.decoder.blocks[0].mlp.fn.down.weight.std().item() == pytest.approx(0.05, rel=0.05)


def test_generate_greedy_equals_full_forward_argmax_with_window() -> None:
    """generate (KV cache) == nanoGPT's loop: crop to max_seq_len, full forward, argmax."""
    model = Transformer(tiny(max_seq_len=8, position="learned")).eval()
    prompt = ids(2, 5)
    out = model.generate(prompt, max_new_tokens=9, temperature=0.0)
    ref = prompt
    for _ in range(9):
        nxt = model(ref[:, -8:])[:, -1].argmax(-1, keepdim=True)
        ref = torch.cat([ref, nxt], dim=1)
    assert out.shape == (2, 14)
    assert torch.equal(out, ref)


def test_generate_sampling_top_k_and_eos() -> None:
    model = Transformer(tiny()).eval()
    out = model.generate(ids(3, 2), max_new_tokens=6, temperature=0.8, top_k=5)
    assert out.shape == (3, 8) and out.max() < V
    logits = model(ids(1, 1))  # make some token the greedy choice, then stop on it
    eos = int(model(out[:1, :2])[:, -1].argmax())
    stopped = model.generate(out[:1, :2], max_new_tokens=6, temperature=0.0, eos_token_id=eos)
    assert stopped.shape == (1, 3) and stopped[0, -1] == eos
    assert logits.shape == (1, 1, V)


def test_generate_never_emits_the_rows_a_padded_vocabulary_adds() -> None:
    model = Transformer(tiny()).eval()
    # the last 4 rows made every position's likeliest tokens, as an untrained padding might be
    model.lm_head.register_forward_hook(lambda m, i, out: out + torch.arange(V).ge(V - 4) * 100.0)
    free = model.generate(ids(2, 3), max_new_tokens=8, temperature=0.0)
    assert (free[:, 3:] >= V - 4).all()  # the test can fail: without the limit they win
    for temperature in (0.0, 1.0):
        out = model.generate(ids(2, 3), max_new_tokens=8, temperature=temperature, vocab_limit=V - 4)
        assert out.shape == (2, 11) and out[:, 3:].max() < V - 4


def test_generate_encoder_decoder() -> None:
    model = Transformer(tiny(arch="encoder_decoder")).eval()
    src = ids(2, 7)
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), 5, temperature=0.0, src_ids=src)
    ref = torch.zeros(2, 1, dtype=torch.long)
    for _ in range(5):
        ref = torch.cat([ref, model(ref, src_ids=src)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ref)


def test_generate_restores_training_mode() -> None:
    model = Transformer(tiny()).train()
    model.generate(ids(1, 2), 2)
    assert model.training


def test_usage_errors_are_clear() -> None:
    dec = Transformer(tiny())
    with pytest.raises(ValueError, match="src_ids is only used with arch=encoder_decoder"):
        dec(ids(1, 4), src_ids=ids(1, 4))
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, seq\]"):
        dec(ids(1, 4)[0])
    encdec = Transformer(tiny(arch="encoder_decoder"))
    with pytest.raises(ValueError, match="needs src_ids"):
        encdec(ids(1, 4))
    enc = Transformer(tiny(arch="encoder"))
    with pytest.raises(ValueError, match="generate needs arch=decoder"):
        enc.generate(ids(1, 2), 3)
    with pytest.raises(ValueError, match="KV cache needs a decoder"):
        enc.new_cache()
    learned = Transformer(tiny(max_seq_len=8, arch="encoder_decoder"))
    with pytest.raises(ValueError, match="source of length 9"):
        learned(ids(1, 4), src_ids=ids(1, 9))
    with pytest.raises(ValueError, match="input of length 9 at offset 0 needs positions up to 9"):
        learned(ids(1, 9), src_ids=ids(1, 4))


def test_logits_shape_and_loss_outside() -> None:
    model = Transformer(tiny())
    logits = model(ids(3, 7))
    assert logits.shape == (3, 7, V)
    labels = ids(3, 7)
    labels[0, :3] = -100
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert abs(loss.item() - math.log(V)) < 0.5  # small init -> near-uniform predictions


def test_kv_cache_with_left_padding_equals_full_forward() -> None:
    model = Transformer(tiny(position="alibi", n_kv_heads=2)).eval()
    x = ids(2, 10)
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[1, :3] = False  # row 1 is left-padded
    full = model(x, attention_mask=keep)
    cache = model.new_cache()
    steps = [model(x[:, :4], attention_mask=keep[:, :4], cache=cache)]
    for t in range(4, 10):
        steps.append(model(x[:, t:t + 1], attention_mask=keep[:, t:t + 1], cache=cache))
    cached = torch.cat(steps, 1)
    # real positions agree (a pad query attends to nothing real; its output is unused)
    torch.testing.assert_close(cached[0], full[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cached[1, 3:], full[1, 3:], atol=1e-5, rtol=1e-4)
    # and the padding really is ignored: other pad tokens, same real outputs
    y = x.clone()
    y[1, :3] = (y[1, :3] + 5) % V
    torch.testing.assert_close(model(y, attention_mask=keep)[1, 3:], full[1, 3:])


def test_bf16_forward_runs_and_is_close() -> None:
    model = Transformer(tiny(position="rope", norm="rmsnorm", mlp="swiglu")).eval()
    x = ids(2, 8)
    ref = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)
