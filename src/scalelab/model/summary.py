"""Printable accounting: params and FLOPs per component, per block and in total.

Computed from the ModelConfig alone (nothing is allocated), so it works for GPT-3-sized
shapes. Uses rich tables when rich is installed, plain text otherwise (model/ itself only
needs torch).
"""

from __future__ import annotations

import io
from typing import Any

from .config import ModelConfig


def summarize(cfg: ModelConfig, seq_len: int | None = None) -> dict[str, Any]:
    """All numbers the summary prints, as a dict (also what ``--json`` emits)."""
    t = cfg.max_seq_len if seq_len is None else int(seq_len)
    n = cfg.n_params()
    rows = []
    for c in cfg.breakdown():
        fwd = 4 * t * cfg.d_model if c.kind == "attention_scores" else c.fwd_flops
        rows.append(dict(name=c.name, kind=c.kind, count=c.count, params_each=c.params,
                         params=c.total_params, share=c.total_params / n,
                         fwd_flops_each=fwd, fwd_flops=fwd * c.count))
    emb = sum(r["params"] for r in rows if r["kind"] == "embedding")
    per_block = {}
    for stack in ("encoder", "decoder"):
        block_rows = [r for r in rows if r["name"].startswith(f"{stack} block")]
        if block_rows:
            per_block[stack] = dict(
                params=sum(r["params_each"] for r in block_rows),
                fwd_flops=sum(r["fwd_flops_each"] for r in block_rows))
    return dict(
        config=cfg.to_dict(), seq_len=t, rows=rows, per_block=per_block,
        n_params=n, n_params_non_embedding=cfg.n_params(non_embedding=True),
        n_params_matmul=cfg.n_params_matmul(), embedding_params=emb, embedding_share=emb / n,
        twelve_l_d2=12 * cfg.n_layers_total * cfg.d_model**2,
        flops_per_token_forward=cfg.flops_per_token(training=False, seq_len=t),
        flops_per_token_train=cfg.flops_per_token(training=True, seq_len=t),
        flops_per_token_6n=cfg.flops_per_token(training=True, attention=False),
    )


def _h(x: float) -> str:
    """Human units: 124.44M, 6.74B, 1.02T."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def _shape(cfg: ModelConfig) -> str:
    layers = (f"{cfg.encoder_layers}+{cfg.decoder_layers} layers" if cfg.arch == "encoder_decoder"
              else f"{cfg.n_layers} layers")
    heads = f"{cfg.n_heads} heads" + (f" ({cfg.kv_heads} kv)" if cfg.kv_heads != cfg.n_heads else "")
    return (f"{cfg.arch}: d_model={cfg.d_model}, {layers}, {heads}, d_ff={cfg.d_ff}, "
            f"vocab={cfg.vocab_size}, max_seq_len={cfg.max_seq_len}; {cfg.norm_position}-{cfg.norm}, "
            f"{cfg.mlp}, {cfg.position} positions, bias={cfg.bias}, tied={cfg.tie_embeddings}")


def _totals(s: dict[str, Any]) -> list[tuple[str, str]]:
    t = s["seq_len"]
    return [
        ("N (parameters, tied counted once)", f"{s['n_params']:,} ({_h(s['n_params'])})"),
        ("N non-embedding", f"{s['n_params_non_embedding']:,}"),
        ("N matmul (non-embedding + output layer)", f"{s['n_params_matmul']:,}"),
        ("embeddings (token + position tables)",
         f"{s['embedding_params']:,} = {100 * s['embedding_share']:.2f}% of N"),
        ("12·L·d² (block matmuls, GPT-2-style)", f"{s['twelve_l_d2']:,} ({_h(s['twelve_l_d2'])})"),
        (f"forward FLOPs/token (T={t}) = 2·N_matmul + 4·L·T·d",
         f"{s['flops_per_token_forward']:,} ({_h(s['flops_per_token_forward'])})"),
        (f"training FLOPs/token (T={t}) = 6·N_matmul + 12·L·T·d",
         f"{s['flops_per_token_train']:,} ({_h(s['flops_per_token_train'])})"),
        ("training FLOPs/token, 6·N_matmul only", f"{s['flops_per_token_6n']:,}"),
    ]


def render_summary(cfg: ModelConfig, seq_len: int | None = None) -> str:
    """The summary as text (rich-rendered tables when rich is available)."""
    s = summarize(cfg, seq_len)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency of scalelab, not of model/
        return _plain(cfg, s)
    console = Console(record=True, file=io.StringIO(), width=120, color_system=None)
    table = Table(title=_shape(cfg), title_justify="left")
    for col, justify in (("component", "left"), ("count", "right"), ("params each", "right"),
                         ("params", "right"), ("% of N", "right"), ("fwd FLOPs/token", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in s["rows"]:
        table.add_row(r["name"], str(r["count"]), f"{r['params_each']:,}", f"{r['params']:,}",
                      f"{100 * r['share']:.2f}", f"{r['fwd_flops']:,}")
    for stack, b in s["per_block"].items():
        table.add_row(f"= one {stack} block", "", f"{b['params']:,}", "", "",
                      f"{b['fwd_flops']:,}", style="bold")
    table.add_row("= total", "", "", f"{s['n_params']:,}", "100.00",
                  f"{s['flops_per_token_forward']:,}", style="bold")
    totals = Table(show_header=False)
    totals.add_column("quantity")
    totals.add_column("value", justify="right")
    for k, v in _totals(s):
        totals.add_row(k, v)
    console.print(table)
    console.print(totals)
    return console.export_text()


def _plain(cfg: ModelConfig, s: dict[str, Any]) -> str:
    lines = [_shape(cfg), ""]
    for r in s["rows"]:
        lines.append(f"{r['name']:<45} x{r['count']:<4} {r['params']:>18,} "
                     f"{100 * r['share']:6.2f}%  {r['fwd_flops']:>20,}")
    lines += [""] + [f"{k:<55} {v}" for k, v in _totals(s)]
    return "\n".join(lines)
