"""Does the best learning rate transfer across widths? Train the same small GPT at several
widths and learning rates, under the standard parametrization and under µP
(``model.parametrization=mup``), over a few seeds, and plot the final held-out loss against
the lr (mean ± sd over the seeds).

    python scripts/mup_lr_transfer.py [--text ../shared/data/tinyshakespeare.txt]
        [--widths 32,64,128,256] [--steps 200] [--seeds 1] [--head-dim N] [--schedule cosine]
        [--parametrizations standard,mup] [--threads N] [--out docs/img/mup]

Two width rules: by default n_heads is fixed (4) and head_dim grows with width; --head-dim N
fixes head_dim and adds heads as width grows, as the sweep's family does (µP then keeps the
attention scale at 1/sqrt(N): ``model.mup_base_head_dim=N``). The base width is the first of
--widths. Seed s sets the init and the training batches' order; the held-out batches are the
same for every run. Under µP the optimum should stay at the same lr as the width grows (Yang
et al. 2022); under the standard parametrization it drifts to smaller lrs. The models, the
optimizer and its µP groups are scalelab's own (Transformer, build_optimizer); the loop is
plain PyTorch so the study runs on a CPU. Writes <name>.png and <name>.json to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from scalelab.model import ModelConfig, Transformer
from scalelab.runtime import thread_plan
from scalelab.training.config import OptimConfig
from scalelab.training.optim import build_optimizer
from scalelab.training.schedules import build_lr_lambda

BATCH, LAYERS, HEADS, VAL_BATCHES = 16, 2, 4, 16


def char_ids(path: Path) -> tuple[torch.Tensor, int]:
    text = path.read_text(encoding="utf-8")
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    return torch.tensor([vocab[c] for c in text], dtype=torch.long), len(vocab)


def batch(ids: torch.Tensor, gen: torch.Generator, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, ids.numel() - block - 1, (BATCH,), generator=gen)
    rows = torch.stack([ids[s:s + block + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def model_config(vocab: int, width: int, parametrization: str, base: int, block: int,
                 head_dim: int | None) -> ModelConfig:
    """n_heads fixed (head_dim None) or head_dim fixed; µP relative to width ``base``."""
    mup = parametrization == "mup"
    return ModelConfig(vocab_size=vocab, max_seq_len=block, d_model=width, n_layers=LAYERS,
                       n_heads=HEADS if head_dim is None else width // head_dim,
                       parametrization=parametrization, mup_base_width=base if mup else None,
                       mup_base_head_dim=head_dim if mup else None)


def train_once(train: torch.Tensor, val: torch.Tensor, cfg: ModelConfig, lr: float, steps: int,
               seed: int, schedule: str) -> float:
    """Final held-out loss of one run; NaN if it diverged. AdamW without weight decay, gradient
    clipping at 1 and (cosine) 5 % warmup then decay to lr/10, as a sweep point trains: the
    decay takes most of the step-to-step noise out of the final loss."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    optim = OptimConfig(lr=lr, weight_decay=0.0, fused=False, schedule=schedule,
                        warmup_fraction=0.05 if schedule == "cosine" else 0.0)
    opt, _ = build_optimizer(model, optim, hidden_lr_scale=1.0 / cfg.width_multiplier)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, build_lr_lambda(optim, steps))
    gen = torch.Generator().manual_seed(1000 + seed)
    for _ in range(steps):
        x, y = batch(train, gen, cfg.max_seq_len)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        if not math.isfinite(loss.item()):
            return float("nan")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        opt.step()
        sched.step()
    model.eval()
    val_gen = torch.Generator().manual_seed(2)  # the same held-out batches for every run
    with torch.no_grad():
        losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                  for x, y in (batch(val, val_gen, cfg.max_seq_len) for _ in range(VAL_BATCHES))]
    return sum(losses) / len(losses)


def summarize(by_lr: dict[float, list[float]]) -> dict[str, object]:
    """Best lr by the seed mean, each seed's own best lr, and whether the optimum's position is
    outside the seed noise: inside the grid, and each neighbour's loss minus the best one's,
    seed by seed, has a mean larger than its sd."""
    def mean(v: list[float]) -> float:
        return statistics.fmean(v) if all(map(math.isfinite, v)) else math.inf

    lrs = sorted(by_lr)
    best = min(lrs, key=lambda lr: mean(by_lr[lr]))
    i = lrs.index(best)
    neighbours = [lrs[j] for j in (i - 1, i + 1) if 0 <= j < len(lrs)]
    per_seed = [min(lrs, key=lambda lr, s=s: by_lr[lr][s] if math.isfinite(by_lr[lr][s])
                    else math.inf) for s in range(len(by_lr[best]))]
    edge = i in (0, len(lrs) - 1)  # the optimum may lie beyond the grid
    gaps = [[a - b for a, b in zip(by_lr[n], by_lr[best], strict=True)] for n in neighbours]
    resolved = not edge and len(by_lr[best]) > 1 and all(
        statistics.fmean(g) > statistics.stdev(g) for g in gaps)
    return {"best_lr": best, "best_loss": mean(by_lr[best]), "per_seed_best_lr": per_seed,
            "resolved": resolved, "at_grid_edge": edge, **optimum_interval(by_lr)}


def optimum_interval(by_lr: dict[float, list[float]], n_boot: int = 2000) -> dict[str, float]:
    """The optimum's position between grid points: log2 of the lr at the vertex of the parabola
    (in log2 lr) through the best seed-mean loss and its two neighbours, with a 95 % interval
    from resampling the seeds (a diverged seed makes its resample's curve infinite there)."""
    import numpy as np

    lrs = sorted(by_lr)
    x = np.log2(lrs)
    y = np.array([by_lr[lr] for lr in lrs], dtype=float)  # [lr, seed]
    y[~np.isfinite(y)] = np.inf

    def vertex(curve: np.ndarray) -> float:
        i = int(np.argmin(curve))
        if i in (0, len(curve) - 1) or not np.isfinite(curve[i - 1:i + 2]).all():
            return float(x[i])  # at the grid's edge, or a diverged neighbour: the grid point
        c = np.polyfit(x[i - 1:i + 2], curve[i - 1:i + 2], 2)
        return float(-c[1] / (2 * c[0]))

    rng = np.random.default_rng(0)
    seeds = y.shape[1]
    boot = [vertex(y[:, rng.integers(0, seeds, seeds)].mean(axis=1)) for _ in range(n_boot)]
    lo, hi = np.percentile(boot, [2.5, 97.5]) if seeds > 1 else (math.nan, math.nan)
    return {"optimum_log2_lr": vertex(y.mean(axis=1)), "optimum_log2_lo": float(lo),
            "optimum_log2_hi": float(hi)}


def plot(results: dict[str, dict[int, dict[float, list[float]]]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), sharey=True,
                             squeeze=False)
    finite: list[float] = []
    for ax, (par, by_width) in zip(axes[0], results.items(), strict=True):
        for width, by_lr in by_width.items():
            lrs = [lr for lr in sorted(by_lr) if all(map(math.isfinite, by_lr[lr]))]
            means = [statistics.fmean(by_lr[lr]) for lr in lrs]
            sds = [statistics.stdev(by_lr[lr]) if len(by_lr[lr]) > 1 else 0.0 for lr in lrs]
            finite += means
            line = ax.errorbar(lrs, means, yerr=sds, marker="o", markersize=3, capsize=2,
                               label=f"d={width}")[0]
            best = summarize(by_lr)["best_lr"]
            ax.plot([best], [statistics.fmean(by_lr[best])], marker="*", markersize=12,
                    color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate")
        ax.set_title(f"{'µP' if par == 'mup' else 'standard parametrization'}{title}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out loss (mean ± sd over seeds)")
    axes[0][-1].legend(title="width", fontsize=8)
    axes[0][0].set_ylim(min(finite) - 0.03, min(max(finite), min(finite) + 0.6))
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", type=Path, default=Path("../shared/data/tinyshakespeare.txt"))
    ap.add_argument("--widths", default="32,64,128,256", help="the first is µP's base width")
    ap.add_argument("--lrs", default="2**-11,2**-10,2**-9,2**-8,2**-7,2**-6,2**-5")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per (width, lr)")
    ap.add_argument("--head-dim", type=int, default=None,
                    help="fix head_dim (n_heads = width / N) instead of n_heads = 4")
    ap.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    ap.add_argument("--block", type=int, default=64, help="tokens per sequence")
    ap.add_argument("--parametrizations", default="standard,mup")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    ap.add_argument("--name", default="lr_transfer", help="output file stem")
    ap.add_argument("--out", type=Path, default=Path("docs/img/mup"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads or thread_plan().threads)
    ids, vocab = char_ids(args.text)
    split = int(0.9 * ids.numel())
    widths = [int(w) for w in args.widths.split(",")]
    lrs = [float(eval(lr, {"__builtins__": {}})) for lr in args.lrs.split(",")]  # "2**-9"
    pars = args.parametrizations.split(",")
    try:
        for w in widths:
            for par in pars:
                model_config(vocab, w, par, widths[0], args.block, args.head_dim)
    except ValueError as e:
        raise SystemExit(f"--widths/--head-dim: {e}") from None
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"widths": widths, "lrs": lrs, "steps": args.steps, "seeds": args.seeds,
            "base_width": widths[0], "head_dim": args.head_dim, "block": args.block,
            "batch": BATCH, "layers": LAYERS, "schedule": args.schedule}
    results: dict[str, dict[int, dict[float, list[float]]]] = {}
    for par in pars:
        results[par] = {}
        for width in widths:
            cfg = model_config(vocab, width, par, widths[0], args.block, args.head_dim)
            results[par][width] = {lr: [train_once(ids[:split], ids[split:], cfg, lr, args.steps, s,
                                                   args.schedule)
                                        for s in range(args.seeds)] for lr in lrs}
            s = summarize(results[par][width])
            print(f"{par:8s} d={width:4d} heads={cfg.n_heads:3d}  best lr 2^{math.log2(s['best_lr']):.0f}"
                  f"  loss {s['best_loss']:.4f}  per seed "
                  f"{[f'2^{math.log2(lr):.0f}' for lr in s['per_seed_best_lr']]}"
                  f"  resolved {s['resolved']}  optimum 2^{s['optimum_log2_lr']:.2f} "
                  f"[{s['optimum_log2_lo']:.2f}, {s['optimum_log2_hi']:.2f}]", flush=True)
            # after every width, so an interrupted study keeps what it measured
            (args.out / f"{args.name}.json").write_text(json.dumps(meta | {
                "summary": {p: {str(w): summarize(d) for w, d in r.items()}
                            for p, r in results.items()},
                "results": {p: {str(w): {str(lr): v for lr, v in d.items()} for w, d in r.items()}
                            for p, r in results.items()}}, indent=1))
    rule = " (n_heads 4)" if args.head_dim is None else f" (head_dim {args.head_dim})"
    plot(results, args.out / f"{args.name}.png", rule)
    print(f"wrote {args.out / args.name}.png and .json")


if __name__ == "__main__":
    main()
