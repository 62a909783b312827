"""Largest logit difference per family, both directions, on random Hugging Face models.

    PYTHONPATH=src python scripts/hf_parity.py
Builds small random GPT-2, Llama (GQA, MQA, MHA with bias) and BERT models offline, perturbs
every weight (HF inits norms to 1 and biases to 0), then: HF -> scalelab (import) and
scalelab -> HF (export, loaded back with from_pretrained), fp32, on 2 x 32 random tokens.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "interop"))


def main() -> None:
    from test_hf import _hf_models  # the same models as the tests

    from scalelab.interop.hf_export import export_hf, max_logit_diff, probe_ids
    from scalelab.interop.hf_import import import_hf

    print(f"{'model':<18} {'family':<7} {'kv/heads':>8} {'HF->scalelab':>13} {'scalelab->HF':>13}")
    for name, build in _hf_models().items():
        torch.manual_seed(0)
        hf = build()
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        with tempfile.TemporaryDirectory() as d:
            hf.eval().save_pretrained(f"{d}/hf")
            family, ours = import_hf(f"{d}/hf")
            ids = probe_ids(ours.cfg)
            imp = max_logit_diff(ours, hf, ids)
            exp = export_hf(ours.cfg, ours.state_dict(), f"{d}/back")["max_abs_logit_diff"]
        heads = f"{ours.cfg.kv_heads}/{ours.cfg.n_heads}"
        print(f"{name:<18} {family:<7} {heads:>8} {imp:>13.2e} {exp:>13.2e}")


if __name__ == "__main__":
    main()
