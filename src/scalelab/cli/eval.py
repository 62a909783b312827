"""`scalelab-eval`: loss, perplexity and bits per byte (causal) or masked-token accuracy (MLM)
on a fixed, stated number of held-out tokens, with standard errors.

    scalelab-eval outputs/<run>                      # the run's own corpus, val split
    scalelab-eval <mlflow-run-id> --tokens 65536     # ... and log eval/<data>/<split>/<settings>/...
    scalelab-eval exported/hf_model --data pystdlib  # a --format hf folder (its source's tokenizer)
    scalelab-eval outputs/<run> --data shakespeare --split train
SOURCE is a .ckpt, a run folder, a Hugging Face folder or an MLflow run id.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from scalelab.cli.arg_types import positive_int
from scalelab.cli.checkpoints import load, model_config_dict, model_state_dict, run_meta
from scalelab.data.tokenizers import CORPUS_TOKENIZERS
from scalelab.paths import conf_dir, repo_root

RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def load_model(source: str, tracking_uri: str | None = None) -> tuple[Any, dict[str, Any], str | None]:
    """(Transformer, scalelab run meta, MLflow run id) from a checkpoint, run folder, HF folder
    or run id."""
    from scalelab.model import ModelConfig, Transformer

    run_id = None
    path = Path(source).expanduser()
    if not path.exists() and RUN_ID.match(source):
        from scalelab.tracking.existing import run_output_dir

        run_id, path = source, run_output_dir(source, tracking_uri)
    hf_cfg = path / "config.json"
    if path.is_dir() and hf_cfg.is_file() and "model_type" in json.loads(hf_cfg.read_text()):
        from scalelab.interop.hf_import import import_hf

        _, model = import_hf(path)
        meta: dict[str, Any] = {}
        info = path / "scalelab.json"
        if info.is_file():  # exported by us: the source checkpoint knows the tokenizer and data
            written = json.loads(info.read_text())
            src = written.get("source_checkpoint")
            if src and Path(src).is_file():
                meta = {**run_meta(load(src)), "_path": src}
            meta["_step"] = written.get("global_step")
        return model, meta, run_id
    ckpt = load(path)
    model = Transformer(ModelConfig.from_dict(model_config_dict(ckpt)))
    model.load_state_dict(model_state_dict(ckpt))
    meta = {**run_meta(ckpt), "_path": ckpt["_path"], "_step": ckpt.get("global_step")}
    return model.eval(), meta, run_id


def _prepared(meta: dict[str, Any], data: str | None, data_dir: Path) -> Any:
    from scalelab.data import DataConfig, PreparedData, TokenizerConfig, prepare

    spec = meta.get("tokenizer") or {}
    if data is None:
        if spec.get("dir") and Path(spec["dir"]).is_dir():
            return PreparedData.load(spec["dir"])
        raise ValueError("no prepared corpus recorded for this model; pass --data NAME "
                         "(a conf/data/*.yaml name)")
    yaml = conf_dir() / "data" / f"{data}.yaml"
    if not yaml.is_file():
        names = sorted(p.stem for p in yaml.parent.glob("*.yaml"))
        raise ValueError(f"--data {data}: no {yaml}; choose one of {', '.join(names)}")
    fields = OmegaConf.to_container(OmegaConf.load(yaml), resolve=True)
    tok_name = spec.get("name")
    if not tok_name:
        raise ValueError("the model has no tokenizer recorded; pass --tokenizer NAME (e.g. gpt2)")
    if tok_name in CORPUS_TOKENIZERS and meta.get("data") and data != meta["data"]:
        raise ValueError(f"--data {data}: a {tok_name} vocabulary is built from its own corpus "
                         f"({meta['data']}); evaluate on that corpus, or use a model with a fixed "
                         "vocabulary (byte, gpt2, cl100k_base, ...)")
    return prepare(DataConfig(**fields), TokenizerConfig(name=str(tok_name)),  # type: ignore[arg-type]
                   cache_dir=data_dir, progress=False)


def _data_fields(name: str) -> dict[str, Any]:
    yaml = conf_dir() / "data" / f"{name}.yaml"
    if not yaml.is_file():
        names = sorted(p.stem for p in yaml.parent.glob("*.yaml"))
        raise ValueError(f"--data {name}: no {yaml}; choose one of {', '.join(names)}")
    return OmegaConf.to_container(OmegaConf.load(yaml), resolve=True)  # type: ignore[return-value]


def _run_data_fields(meta: dict[str, Any], run_dir: Path | None) -> dict[str, Any]:
    """The data section the run was trained with (its .hydra/config.yaml), so a synthetic
    seq2seq task is regenerated with the same task, lengths and seed."""
    saved = run_dir / ".hydra" / "config.yaml" if run_dir else None
    if saved and saved.is_file():
        return OmegaConf.to_container(OmegaConf.load(saved).data, resolve=True)  # type: ignore[return-value]
    if meta.get("data"):
        return _data_fields(str(meta["data"]))
    raise ValueError("no data config recorded for this seq2seq model; pass --data NAME")


def _seq2seq(args: argparse.Namespace, model: Any, meta: dict[str, Any]) -> int:
    """Exact match and teacher-forced loss on the first --sequences validation pairs."""
    from scalelab.data import DataConfig, Seq2SeqDataModule
    from scalelab.data.datamodules import collate_seq2seq
    from scalelab.training.evaluate import evaluate_seq2seq

    ckpt = Path(meta.get("_path", "")) if meta.get("_path") else None
    run_dir = ckpt.parent.parent if ckpt and ckpt.parent.name == "checkpoints" else None
    fields = _data_fields(args.data) if args.data else _run_data_fields(meta, run_dir)
    dm = Seq2SeqDataModule(DataConfig(**fields), batch_size=64)
    spec = meta.get("tokenizer") or {}
    if spec.get("chars") is not None and spec["chars"] != dm.vocab.chars:
        raise ValueError("the data's character vocabulary differs from the model's; evaluate on "
                         "the task it was trained on")
    vocab = dm.vocab
    rows = dm.val_examples[: args.sequences]
    batches = [collate_seq2seq(rows[i:i + 64], vocab.pad_id, vocab.bos_id, vocab.eos_id)
               for i in range(0, len(rows), 64)]
    res = evaluate_seq2seq(model.to(args.device), batches, vocab.eos_id, device=args.device)
    dataset = args.data or fields.get("name", "seq2seq")
    print(f"{dataset} val: {res.n_windows:,} sequences ({res.n_tokens:,} target tokens)")
    print(f"  exact match {res.exact_match:.4f} ± {res.exact_match_se:.4f}   loss {res.loss:.4f} ± "
          f"{res.loss_se:.4f}   perplexity {res.perplexity:.3f} ± {res.perplexity_se:.3f}")
    _log(args, meta, dataset, "val", res, f"seq{args.sequences}")
    return 0


def eval_prefix(dataset: str, split: str, settings: str) -> str:
    """The metric key prefix of one evaluation: the settings that change its figures are part
    of the key, so an eval with other settings never overwrites this one."""
    return f"eval/{dataset}/{split}/{settings}"


def _log(args: argparse.Namespace, meta: dict[str, Any], dataset: str, split: str, res: Any,
         settings: str) -> None:
    target = args.run_id or meta.get("_run_id")
    if target:
        from scalelab.tracking.existing import log_to_run

        prefix = eval_prefix(dataset, split, settings)
        metrics = {f"{prefix}/{k}": v for k, v in res.metrics().items()}
        # at the evaluated checkpoint's step: evaluating an earlier checkpoint adds a point
        step = int(meta.get("_step") or 0)
        log_to_run(target, args.tracking_uri, metrics, step=step)
        print(f"logged {len(metrics)} metrics to MLflow run {target} under {prefix}/ "
              f"at step {step}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab-eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="a .ckpt, run folder, Hugging Face folder or MLflow run id")
    ap.add_argument("--data", default=None, help="conf/data name (default: the run's own corpus)")
    ap.add_argument("--split", default="val", choices=("val", "train"))
    ap.add_argument("--tokenizer", default=None,
                    help="our tokenizer for a model that records none (e.g. an HF import)")
    ap.add_argument("--tokens", type=positive_int, default=65_536, help="tokens to score (fixed, stated)")
    ap.add_argument("--sequences", type=positive_int, default=512, help="seq2seq: validation pairs to score")
    ap.add_argument("--block-size", type=positive_int, default=None, help="default: the model's max_seq_len")
    ap.add_argument("--data-dir", default=str(repo_root() / "data_cache"))
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--run-id", default=None,
                    help="log eval/<data>/<split>/tok<N>_ctx<B>/... to this MLflow run")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    from scalelab.interop.families import NoEquivalentError
    from scalelab.training.evaluate import evaluate_causal, evaluate_mlm

    try:
        model, meta, run_id = load_model(args.source, args.tracking_uri)
        meta["_run_id"] = run_id
        if args.tokenizer:
            meta["tokenizer"] = {"name": args.tokenizer}
        cfg = model.cfg
        prepared = None if cfg.arch == "encoder_decoder" else \
            _prepared(meta, args.data, Path(args.data_dir))
        if cfg.arch == "encoder_decoder":
            return _seq2seq(args, model, meta)
        block = min(args.block_size or cfg.max_seq_len, cfg.max_seq_len)
        tokens = prepared.tokens(args.split)
        model.to(args.device)
        torch.manual_seed(0)
        if cfg.arch == "encoder":
            res = evaluate_mlm(model, tokens, args.tokens, block, prepared.tokenizer,
                               device=args.device)
        else:
            res = evaluate_causal(model, tokens, args.tokens, block, prepared.bytes_per_token,
                                  device=args.device)
    except (FileNotFoundError, ValueError, NoEquivalentError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dataset = args.data or meta.get("data") or prepared.dir.name
    scored = f" ({res.n_tokens:,} masked and scored)" if res.objective == "mlm" else ""
    n_in = res.n_tokens if res.objective == "causal" else res.n_windows * block
    print(f"{dataset} {args.split}: {n_in:,} tokens in {res.n_windows} windows of {block}{scored}")
    print(f"  loss {res.loss:.4f} ± {res.loss_se:.4f}   perplexity {res.perplexity:.3f} ± "
          f"{res.perplexity_se:.3f}", end="")
    if res.bits_per_byte is not None:
        print(f"   bits/byte {res.bits_per_byte:.4f} ± {res.bits_per_byte_se:.4f}", end="")
    if res.masked_accuracy is not None:
        print(f"   masked acc {res.masked_accuracy:.4f} ± {res.masked_accuracy_se:.4f}", end="")
    print()
    _log(args, meta, dataset, args.split, res, f"tok{args.tokens}_ctx{block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
