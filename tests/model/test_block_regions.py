"""Transformer.set_block_regions: under torch.compile one block is traced and its code reused for
every layer (torch.compiler.nested_compile_region); the forward and gradients are the eager ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.registry import lookup_backend

from scalelab.model import Transformer
from scalelab.model.blocks import BLOCK_REGIONS_AVAILABLE

from .helpers import tiny

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not BLOCK_REGIONS_AVAILABLE, reason="torch < 2.8: no nested_compile_region")]

CASES = {
    "decoder, RoPE, GQA, SwiGLU, RMSNorm": dict(position="rope", n_kv_heads=2, mlp="swiglu", norm="rmsnorm"),
    "encoder, padding mask": dict(arch="encoder", mlm_head=True),
    "encoder-decoder": dict(arch="encoder_decoder"),
}


def _loss(model: Transformer, cfg_arch: str, x: torch.Tensor) -> torch.Tensor:
    if cfg_arch == "encoder":
        keep = torch.ones_like(x, dtype=torch.bool)
        keep[0, -3:] = False  # a padded row: the mask goes through the region
        logits = model(x, attention_mask=keep)
    elif cfg_arch == "encoder_decoder":
        logits = model(x, src_ids=x.flip(1))
    else:
        logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), x.flatten())


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_block_regions_match_eager_and_trace_one_block(case: str) -> None:
    over: dict[str, Any] = {"n_layers": 3, **CASES[case]}
    torch.manual_seed(0)
    eager = Transformer(tiny(**over))
    compiled = Transformer(tiny(**over))
    compiled.load_state_dict(eager.state_dict())
    compiled.set_block_regions(True)
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        graphs.append(gm)  # then AOT autograd, as inductor would (without its C++ build)
        return lookup_backend("aot_eager")(gm, inputs)

    x = torch.randint(0, 37, (2, 12))
    arch = compiled.cfg.arch
    loss = torch.compile(lambda t: _loss(compiled, arch, t), backend=capture)(x)
    ref = _loss(eager, arch, x)
    torch.testing.assert_close(loss, ref)
    loss.backward()
    ref.backward()
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    # one graph, whose blocks all call one compiled subgraph (its identifier is the call's 2nd
    # argument); an encoder-decoder's two stacks have a block class each (CrossBlock)
    calls = [n for g in graphs for n in g.graph.nodes if "invoke_subgraph" in str(n.target)]
    stacks = 2 if arch == "encoder_decoder" else 1
    assert len(graphs) == 1 and len(calls) == 3 * stacks
    assert len({n.args[1] for n in calls}) == stacks


def test_regions_are_off_by_default_and_leave_eager_unchanged() -> None:
    torch.manual_seed(0)
    model = Transformer(tiny())
    assert model.decoder is not None and not model.decoder.block_regions
    x = torch.randint(0, 37, (2, 8))
    before = model(x)
    model.set_block_regions(True)
    assert torch.equal(model(x), before)  # outside torch.compile the region is a plain call
