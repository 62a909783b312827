"""Hugging Face interop: random HF models of each family built offline -> import -> logits ->
export back -> logits; clear errors; tokenizer conversion; a CLI-trained model round trip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from scalelab.interop.families import NoEquivalentError, family_of  # noqa: E402
from scalelab.interop.hf_export import export_hf, max_logit_diff, probe_ids  # noqa: E402
from scalelab.interop.hf_import import import_hf  # noqa: E402
from scalelab.model import ModelConfig  # noqa: E402

TOL = 1e-4
V = 97


def _hf_models() -> dict[str, object]:
    t = transformers
    small = dict(vocab_size=V)
    return {
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(**small, n_embd=32, n_layer=2, n_head=4,
                                                       n_positions=64, activation_function="gelu_new",
                                                       bos_token_id=0, eos_token_id=0)),
        "llama_gqa_untied": lambda: t.LlamaForCausalLM(t.LlamaConfig(
            **small, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, max_position_embeddings=64, rope_theta=500.0)),
        "llama_mqa_tied": lambda: t.LlamaForCausalLM(t.LlamaConfig(
            **small, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            intermediate_size=80, max_position_embeddings=64, tie_word_embeddings=True)),
        "llama_mha_bias": lambda: t.LlamaForCausalLM(t.LlamaConfig(
            **small, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, attention_bias=True, mlp_bias=True)),
        "bert": lambda: t.BertForMaskedLM(t.BertConfig(
            **small, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_act="gelu_new", type_vocab_size=2)),
        "bert_exact_gelu": lambda: t.BertForMaskedLM(t.BertConfig(
            **small, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, hidden_act="gelu", type_vocab_size=2)),
        "gpt2_exact_gelu": lambda: t.GPT2LMHeadModel(t.GPT2Config(
            **small, n_embd=32, n_layer=1, n_head=4, n_positions=64, activation_function="gelu")),
        "bert_untied": lambda: t.BertForMaskedLM(t.BertConfig(
            **small, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=False)),
    }


@pytest.mark.parametrize("name", list(_hf_models()))
def test_random_hf_model_round_trip_keeps_logits(tmp_path: Path, name: str) -> None:
    torch.manual_seed(0)
    hf = _hf_models()[name]()
    with torch.no_grad():  # HF inits norms to 1 and biases to 0: perturb so every map matters
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.eval().save_pretrained(tmp_path / "hf")
    family, ours = import_hf(f"hf:{tmp_path / 'hf'}")
    assert ours.cfg.mlp in ("swiglu", "gelu_exact" if "exact_gelu" in name else "gelu")
    ids = probe_ids(ours.cfg)
    assert max_logit_diff(ours, hf, ids) <= TOL
    if "gqa" in name or "mqa" in name:
        assert ours.cfg.kv_heads == hf.config.num_key_value_heads < ours.cfg.n_heads
    res = export_hf(ours.cfg, ours.state_dict(), tmp_path / "back")
    assert res["family"] == family and res["max_abs_logit_diff"] <= TOL
    back = type(hf).from_pretrained(tmp_path / "back", dtype=torch.float32)
    assert max_logit_diff(ours, back, ids) <= TOL
    assert not (tmp_path / "back" / "pytorch_model.bin").exists()


@pytest.mark.parametrize("kw", [
    dict(tie_embeddings=False),  # GPT-2 with its own output layer
    dict(mlp="gelu_exact"),  # GPT-2 with the exact GELU
    dict(norm="rmsnorm", mlp="swiglu", position="rope", bias=False, n_kv_heads=1,
         tie_embeddings=False, rope_base=1234.0, norm_eps=1e-6),  # Llama MQA
    dict(arch="encoder", norm_position="post", embed_norm=True, mlm_head=True,
         tie_embeddings=False, norm_eps=1e-12),  # BERT, untied (decoder bias != cls bias)
    dict(arch="encoder", norm_position="post", embed_norm=True, mlm_head=True, mlp="gelu_exact",
         norm_eps=1e-12, attention="math"),  # BERT as Hugging Face's default hidden_act="gelu" has it
])
def test_our_model_exports_and_imports_back_exactly(tmp_path: Path, kw: dict) -> None:
    from scalelab.model import Transformer

    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, max_seq_len=40, **kw)
    ours = Transformer(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    res = export_hf(cfg, ours.state_dict(), tmp_path / "hf")
    assert res["max_abs_logit_diff"] <= TOL
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["torch_dtype"] == "float32"  # the name transformers before 4.56 reads
    if cfg.position == "rope":  # transformers 4.x ignores rope_parameters: rope_theta as well
        assert written["rope_theta"] == cfg.rope_base == written["rope_parameters"]["rope_theta"]
    _, back = import_hf(tmp_path / "hf")
    assert back.cfg == cfg.replace(attention="sdpa")  # how attention is computed is not exported
    ids = probe_ids(cfg)
    with torch.no_grad():
        assert float((back(ids) - ours(ids)).abs().max()) <= TOL


@pytest.mark.parametrize("kw", [
    dict(),  # GPT-2: c_attn is qkv_proj transposed (Conv1D stores [in, out])
    dict(norm="rmsnorm", mlp="swiglu", position="rope", n_kv_heads=2),  # Llama, with biases
    dict(arch="encoder", norm_position="post", embed_norm=True, mlm_head=True),  # BERT
])
def test_the_fused_qkv_rows_map_onto_each_formats_tensors(kw: dict) -> None:
    from scalelab.interop.families import from_hf, to_hf
    from scalelab.model import Transformer

    cfg = ModelConfig(vocab_size=61, d_model=32, n_layers=1, n_heads=4, max_seq_len=40, **kw)
    sd = Transformer(cfg).state_dict()
    stack = "encoder" if cfg.arch == "encoder" else "decoder"
    w, b = (sd[f"{stack}.blocks.0.self_attn.fn.qkv_proj.{p}"] for p in ("weight", "bias"))
    q, k, v = w.split([32, cfg.kv_heads * 8, cfg.kv_heads * 8])
    hf = to_hf(cfg, sd)
    family = family_of(cfg)
    if family == "gpt2":
        assert torch.equal(hf["transformer.h.0.attn.c_attn.weight"], w.t())
        assert torch.equal(hf["transformer.h.0.attn.c_attn.bias"], b)
    elif family == "llama":
        for name, part in zip(("q_proj", "k_proj", "v_proj"), (q, k, v), strict=True):
            assert torch.equal(hf[f"model.layers.0.self_attn.{name}.weight"], part)
    else:
        for name, part in zip(("query", "key", "value"), (q, k, v), strict=True):
            assert torch.equal(hf[f"bert.encoder.layer.0.attention.self.{name}.weight"], part)
    back = from_hf(cfg, family, hf)
    assert all(torch.equal(back[key], sd[key]) for key in back)


@pytest.mark.parametrize(("changes", "named"), [
    ({"position": "alibi"}, "model.position='alibi'"),
    ({"position": "sinusoidal"}, "model.position='sinusoidal'"),
    ({"norm_position": "post"}, "model.norm_position='post'"),
    ({"arch": "encoder_decoder"}, "model.arch='encoder_decoder'"),
    ({"arch": "encoder", "norm_position": "post", "final_norm": False}, "model.embed_norm=true"),
])
def test_no_equivalent_names_the_options(changes: dict, named: str) -> None:
    cfg = ModelConfig(vocab_size=V, d_model=32, n_layers=1, n_heads=4, max_seq_len=16, **changes)
    with pytest.raises(NoEquivalentError, match="no Hugging Face equivalent") as e:
        family_of(cfg)
    assert named in str(e.value)


def test_export_failure_leaves_nothing(tmp_path: Path) -> None:
    cfg = ModelConfig(vocab_size=V, d_model=32, n_layers=1, n_heads=4, max_seq_len=16,
                      position="alibi")
    from scalelab.model import Transformer

    with pytest.raises(NoEquivalentError):
        export_hf(cfg, Transformer(cfg).state_dict(), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_import_refuses_pickles_and_inexpressible_fields(tmp_path: Path) -> None:
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_embd=16, n_layer=1, n_head=2, n_positions=16))
    hf.save_pretrained(tmp_path / "bin", safe_serialization=True)
    (tmp_path / "bin" / "model.safetensors").rename(tmp_path / "bin" / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pickles are never loaded"):
        import_hf(tmp_path / "bin")
    hf.config.activation_function = "relu"  # GPT-2 with ReLU: not one of our GELUs
    hf.save_pretrained(tmp_path / "relu")
    with pytest.raises(NoEquivalentError, match=r"activation_function='relu'.*mlp=gelu_exact"):
        import_hf(tmp_path / "relu")


def test_bert_extras_are_counted_exactly() -> None:
    from scalelab.model import Transformer

    cfg = ModelConfig(arch="encoder", vocab_size=V, d_model=32, n_layers=1, n_heads=4,
                      max_seq_len=16, norm_position="post", embed_norm=True, mlm_head=True)
    assert cfg.n_params() == sum(p.numel() for p in Transformer(cfg).parameters())


@pytest.mark.slow
def test_cli_trained_model_exports_to_transformers_and_trains_from_hf(
        tmp_path: Path, train_cli, shared_data_dir: Path) -> None:
    """A llama_tiny (GQA) trained a few steps through scalelab-train -> scalelab-export --format hf
    -> transformers; then scalelab-import and model.init_from=hf: start a new run from it."""
    out = tmp_path / "run"
    common = [*train_cli.isolated(tmp_path), "logger=none", "model=llama_tiny", "data=shakespeare",
              f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", "tokenizer=byte", "model.n_layers=2", "train.global_batch_size=4",
              "train.block_size=32", "train.val_every=3", "train.val_batches=1"]
    r = train_cli.run(*common, "train.max_steps=3", f"paths.output_dir={out}", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    hf_dir = tmp_path / "hf"
    r = subprocess.run([sys.executable, "-m", "scalelab.cli.export", str(out), "--format", "hf",
                        "--out", str(hf_dir)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "LlamaForCausalLM" in r.stdout
    assert "note: the folder loads with transformers 4.57.6 and 5.25.0" in r.stdout  # where the proof stops
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (hf_dir / name).is_file(), name

    from scalelab.cli.checkpoints import load, model_config_dict, model_state_dict
    from scalelab.model import Transformer

    ckpt = load(out)
    ours = Transformer(ModelConfig.from_dict(model_config_dict(ckpt)))
    ours.load_state_dict(model_state_dict(ckpt))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    assert theirs.config.num_key_value_heads == 2
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ids = torch.tensor([tok("ROMEO: what light")["input_ids"]])
    assert max_logit_diff(ours, theirs, ids) <= TOL

    r = subprocess.run([sys.executable, "-m", "scalelab.cli.interop", str(hf_dir), "--out",
                        str(tmp_path / "imported"), "--tokenizer", "byte"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((tmp_path / "imported" / "config.json").read_text())
    assert info["family"] == "llama" and info["max_abs_logit_diff"] <= TOL

    r = train_cli.run(*common, "train.max_steps=1", f"model.init_from=hf:{hf_dir}",
                      f"paths.output_dir={tmp_path / 'ft'}", "callbacks.sample.enabled=false",
                      "logger=mlflow", "run_name=ft", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"init from     : hf:{hf_dir}" in r.stdout + r.stderr  # the banner names it
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "params.run_name = 'ft'")
    assert [x.data.params["init_from"] for x in runs] == [f"hf:{hf_dir}"]
    r = train_cli.run(*common, "train.max_steps=1", f"model.init_from=hf:{tmp_path / 'nope'}",
                      f"paths.output_dir={tmp_path / 'bad'}")
    assert r.returncode == 2 and "model.init_from" in r.stderr


def test_init_from_takes_positions_from_hf_and_names_the_tokenizer_fix(tmp_path: Path) -> None:
    """A BERT with 64 positions under model=bert_tiny (block size 128 from the preset): the run
    uses 64. A tokenizer larger than the model's vocabulary gets an error that names the fix."""
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec

    hf = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64))
    hf.save_pretrained(tmp_path / "bert")
    cfg = compose("train", ["model=bert_tiny", "data=shakespeare", "tokenizer=byte",
                            f"model.init_from=hf:{tmp_path / 'bert'}", "logger=none"])
    assert cfg.train.block_size > 64  # the preset's, before the HF config is read
    spec = build_spec(cfg)
    assert spec.block_size == spec.model.max_seq_len == 64 and spec.model.vocab_size == V
    with pytest.raises(ValueError, match=r"model.init_from=hf:.*97 ids but tokenizer=byte has 260"):
        spec.with_vocab(260)
