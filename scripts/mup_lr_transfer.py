"""Does the best learning rate transfer across widths? Train the same small GPT at several
widths and learning rates, under the standard parametrization and under µP
(``model.parametrization=mup``), and plot the final held-out loss against the lr.

    python scripts/mup_lr_transfer.py [--text ../shared/data/tinyshakespeare.txt]
        [--widths 32,64,128,256] [--steps 200] [--out docs/img/mup]

Under µP the optimum stays at the same lr as the width grows (Yang et al. 2022); under the
standard parametrization it drifts to smaller lrs. The models, the optimizer and its µP
groups are scalelab's own (Transformer, build_optimizer); the loop is plain PyTorch so the
study takes minutes on a CPU. Writes lr_transfer.png and lr_transfer.json to --out.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from scalelab.model import ModelConfig, Transformer
from scalelab.runtime import thread_plan
from scalelab.training.config import OptimConfig
from scalelab.training.optim import build_optimizer

BLOCK, BATCH, LAYERS, HEADS = 64, 16, 2, 4


def char_ids(path: Path) -> tuple[torch.Tensor, int]:
    text = path.read_text(encoding="utf-8")
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    return torch.tensor([vocab[c] for c in text], dtype=torch.long), len(vocab)


def batch(ids: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, ids.numel() - BLOCK - 1, (BATCH,), generator=gen)
    rows = torch.stack([ids[s:s + BLOCK + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def train_once(train: torch.Tensor, val: torch.Tensor, vocab: int, width: int, lr: float,
               parametrization: str, base: int, steps: int) -> float:
    """Final held-out loss of one run (same data order and init seed for every run)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, max_seq_len=BLOCK, d_model=width, n_layers=LAYERS,
                      n_heads=HEADS, parametrization=parametrization,
                      mup_base_width=base if parametrization == "mup" else None)
    model = Transformer(cfg)
    opt, _ = build_optimizer(model, OptimConfig(lr=lr, weight_decay=0.0, fused=False),
                             hidden_lr_scale=1.0 / cfg.width_multiplier)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = batch(train, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        if not math.isfinite(loss.item()):
            return float("nan")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    val_gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                  for x, y in (batch(val, val_gen) for _ in range(8))]
    return sum(losses) / len(losses)


def plot(results: dict[str, dict[int, dict[float, float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (par, by_width) in zip(axes, results.items(), strict=True):
        for width, by_lr in by_width.items():
            lrs = sorted(by_lr)
            line, = ax.plot(lrs, [by_lr[lr] for lr in lrs], marker="o", label=f"d={width}")
            best = min(lrs, key=lambda lr: by_lr[lr] if math.isfinite(by_lr[lr]) else math.inf)
            ax.plot([best], [by_lr[best]], marker="*", markersize=14, color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate")
        ax.set_title("µP" if par == "mup" else "standard parametrization")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out loss")
    axes[1].legend(title="width")
    finite = [v for w in results.values() for d in w.values() for v in d.values() if math.isfinite(v)]
    axes[0].set_ylim(min(finite) - 0.05, min(max(finite), min(finite) + 1.2))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", type=Path, default=Path("../shared/data/tinyshakespeare.txt"))
    ap.add_argument("--widths", default="32,64,128,256")
    ap.add_argument("--lrs", default="2**-11,2**-10,2**-9,2**-8,2**-7,2**-6,2**-5")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("docs/img/mup"))
    args = ap.parse_args()
    torch.set_num_threads(thread_plan().threads)
    ids, vocab = char_ids(args.text)
    split = int(0.9 * ids.numel())
    widths = [int(w) for w in args.widths.split(",")]
    lrs = [float(eval(lr, {"__builtins__": {}})) for lr in args.lrs.split(",")]  # "2**-9"
    results: dict[str, dict[int, dict[float, float]]] = {}
    for par in ("standard", "mup"):
        results[par] = {}
        for width in widths:
            results[par][width] = {lr: train_once(ids[:split], ids[split:], vocab, width, lr,
                                                  par, widths[0], args.steps) for lr in lrs}
            by_lr = results[par][width]
            best = min(by_lr, key=lambda lr: by_lr[lr] if math.isfinite(by_lr[lr]) else math.inf)
            print(f"{par:8s} d={width:4d}  best lr 2^{math.log2(best):.0f}  loss {by_lr[best]:.4f}",
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, args.out / "lr_transfer.png")
    (args.out / "lr_transfer.json").write_text(json.dumps(
        {"widths": widths, "lrs": lrs, "steps": args.steps, "base_width": widths[0],
         "results": {p: {str(w): {str(lr): v for lr, v in d.items()} for w, d in r.items()}
                     for p, r in results.items()}}, indent=1))
    print(f"wrote {args.out / 'lr_transfer.png'}")


if __name__ == "__main__":
    main()
