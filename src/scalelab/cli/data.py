"""scalelab-data: prepare token shards on their own (``make data``).

Composes the same conf/train.yaml as scalelab-train and runs only prepare() for
cfg.data / cfg.tokenizer into cfg.paths.data_dir, e.g.::

    scalelab-data                              # the default corpus + tokenizer
    scalelab-data data=shakespeare_char data.path=../shared/data/tinyshakespeare.txt
    scalelab-data data=pystdlib tokenizer=bpe tokenizer.vocab_size=4096
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from scalelab.config.schema import register
from scalelab.paths import conf_dir

CONF_DIR = str(conf_dir())  # the package's conf/ (shipped in the wheel)
register()  # train_schema and the ${scalelab.*} resolvers conf/train.yaml uses, before composing


def run(cfg: DictConfig) -> int:
    from scalelab.data import DataConfig, TokenizerConfig, prepare

    data_cfg = DataConfig(**OmegaConf.to_container(cfg.data, resolve=True))  # type: ignore[arg-type]
    tok_cfg = TokenizerConfig(**OmegaConf.to_container(cfg.tokenizer, resolve=True))  # type: ignore[arg-type]
    if data_cfg.is_seq2seq:
        print(f"data={data_cfg.name} is generated on the fly: nothing to prepare")
        return 0
    p = prepare(data_cfg, tok_cfg, Path(cfg.paths.data_dir), progress=True)
    m = p.meta
    print(
        f"{p.dir}\n  tokenizer {m['tokenizer']['name']} vocab {m['vocab_size']} ({m['dtype']})\n"
        f"  train {m['train_tokens']:,} tokens / {m['train_bytes']:,} bytes\n"
        f"  val   {m['val_tokens']:,} tokens / {m['val_bytes']:,} bytes "
        f"({m['bytes_per_token']:.3f} bytes/token)"
    )
    return 0


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"scalelab-data: error: {e}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
