"""`scalelab-sample`: text from a trained checkpoint (loaded with torch.load(weights_only=True)).

    scalelab-sample outputs/2026-01-01/12-00-00_shakespeare_char          # a run folder
    scalelab-sample path/to/last.ckpt --prompt "ROMEO:" --num-samples 3 --max-new-tokens 300

Decoders continue the prompt; encoder-decoders (seq2seq) translate the prompt greedily.
"""

from __future__ import annotations

import argparse
import sys

import torch

from scalelab.cli.arg_types import non_negative_int, positive_int, temperature
from scalelab.cli.checkpoints import (
    load,
    model_config_dict,
    run_meta,
    tokenizer_from_spec,
    verified_model,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab-sample", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a .ckpt file or a run folder (uses checkpoints/last.ckpt)")
    ap.add_argument("--prompt", default="\n")
    ap.add_argument("--num-samples", type=positive_int, default=1)
    ap.add_argument("--max-new-tokens", type=positive_int, default=200)
    ap.add_argument("--temperature", type=temperature, default=0.8, help="0: greedy")
    ap.add_argument("--top-k", type=non_negative_int, default=200, help="0: no top-k cut")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    from scalelab.model import ModelConfig

    try:
        ckpt = load(args.checkpoint)
        cfg = ModelConfig.from_dict(model_config_dict(ckpt))
        meta = run_meta(ckpt)
        if "tokenizer" not in meta:
            raise ValueError(f"{ckpt['_path']}: no tokenizer spec in the checkpoint")
        tok = tokenizer_from_spec(meta["tokenizer"])
        model = verified_model(ckpt)  # tensors that no longer fit the stored config: one line
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model.to(args.device).eval()
    torch.manual_seed(args.seed)
    top_k = args.top_k if args.top_k > 0 else None
    with torch.no_grad():
        for i in range(args.num_samples):
            if cfg.arch == "encoder_decoder":
                src = torch.tensor([tok.encode(args.prompt.strip())], device=args.device)
                start = torch.tensor([[tok.bos_id]], device=args.device)
                out = model.generate(start, args.max_new_tokens, temperature=0.0, src_ids=src,
                                     eos_token_id=tok.eos_id, vocab_limit=tok.vocab_size)
                ids = [t for t in out[0, 1:].tolist() if t != tok.eos_id]
                text = tok.decode(ids)
            elif cfg.arch == "decoder":
                ids = tok.encode(args.prompt) or [tok.eot_id]
                x = torch.tensor([ids], dtype=torch.long, device=args.device)
                out = model.generate(x, args.max_new_tokens, temperature=args.temperature, top_k=top_k,
                                     vocab_limit=tok.vocab_size)
                text = tok.decode(out[0].tolist())
            else:
                print("error: encoder-only (MLM) checkpoints do not generate text", file=sys.stderr)
                return 2
            if args.num_samples > 1:
                print(f"--- sample {i + 1} ---")
            print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
