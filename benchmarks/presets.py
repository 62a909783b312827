"""The bench's presets and its data, built the way ``scalelab-train`` builds them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = Path(os.environ.get("SCALELAB_SHAKESPEARE",
                                  ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))

PRESETS: dict[str, list[str]] = {
    "shakespeare_char": ["+experiment=shakespeare_char"]
    + ([f"data.path={SHAKESPEARE}"] if SHAKESPEARE.is_file() else []),
    "pystdlib_small": [],  # the default experiment
    "llama": ["+experiment=llama_tiny_pystdlib"],  # RoPE, RMSNorm, SwiGLU, GQA
    "encoder": ["+experiment=bert_mlm_small"],  # masked LM
    "encdec": ["+experiment=reverse_seq2seq"],
    # One mid-sized point of `scalelab-sweep sweep=cpu_medium`: the sweep preset's own
    # train_overrides (sweep_point_overrides), then the point's. Its steps are tiny, so fixed
    # per-step work decides a sweep's wall time; a sweep runs one job a core: 1 thread.
    "sweep_point": ["model.d_model=12", "model.n_layers=2", "model.n_heads=3",
                    "train.global_batch_size=7", "optim.lr=0.020447", "optim.warmup_steps=12",
                    "optim.beta2=0.95", "optim.min_lr_ratio=0.1", "train.max_steps=1842",
                    "train.val_every=460", "train.val_batches=2", "trainer.log_every_n_steps=19",
                    "trainer.enable_progress_bar=false", "callbacks.checkpoint.save_best=false"],
}
PRESET_THREADS = {"sweep_point": 1}

# GPT-2 124M and a Llama of its size, as a GPU trains them: bf16, torch.compile, fused AdamW,
# batch 32 x 1024, GPT-2's tokenizer with the vocabulary padded to a multiple of 128.
GPU_COMMON = ["trainer=gpu", "trainer.precision=bf16-mixed", "train.compile=true",
              "optim.fused=true", "train.block_size=1024", "train.global_batch_size=32",
              "tokenizer=r50k_base", "model.vocab_size=50304", "data=pystdlib"]
GPU_PRESETS: dict[str, list[str]] = {
    "gpt2_124m": ["model=gpt2", *GPU_COMMON],
    "llama_124m": ["model=llama_tiny", "model.d_model=768", "model.n_layers=12", "model.n_heads=12",
                   "model.n_kv_heads=4", "model.max_seq_len=1024", "model.tie_embeddings=true",
                   "model.d_ff=2432", *GPU_COMMON],
}


def sweep_point_overrides(src: Path) -> list[str]:
    """cpu_medium's ``train_overrides`` in the checkout whose ``src`` folder is given: each
    checkout's sweep point runs as that checkout's sweep would run it."""
    preset = src / "scalelab" / "conf" / "sweep" / "cpu_medium.yaml"
    return [str(o) for o in OmegaConf.load(preset).train_overrides]


def preset_overrides(name: str, src: Path = ROOT / "src", gpu: bool = False) -> list[str]:
    table = GPU_PRESETS if gpu else PRESETS
    if name not in table:
        raise ValueError(f"--presets: no preset {name!r}; choose from {', '.join(table)}")
    head = sweep_point_overrides(src) if name == "sweep_point" else []
    return [*head, *table[name]]


def data_dir() -> Path:
    """Token shards the bench's runs share, so only the first run of a preset prepares them."""
    return Path(os.environ.get("SCALELAB_BENCH_DATA", ROOT / "data_cache"))


def prepare_preset(overrides: list[str], n_batches: int = 16) -> dict[str, Any]:
    """The run's config and spec, its model config and DataModule, and ``n_batches`` train
    batches, as ``scalelab-train`` builds them from the same overrides."""
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec
    from scalelab.data.bundle import build_data_bundle

    cfg = compose("train", overrides)
    cfg.paths.data_dir = str(data_dir())
    spec = build_spec(cfg)
    data = build_data_bundle(spec.objective, spec.data, spec.tokenizer,
                             micro_batch=spec.batch.micro_batch, block_size=spec.block_size,
                             seed=spec.seed, val_batches=int(spec.train.val_batches),
                             cache_dir=data_dir(), progress=False)
    it = iter(data.datamodule.train_dataloader())
    return {"cfg": cfg, "spec": spec, "model_cfg": spec.with_vocab(data.vocab_size),
            "batches": [next(it) for _ in range(n_batches)], "datamodule": data.datamodule}
