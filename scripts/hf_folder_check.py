"""Load an exported Hugging Face folder with plain transformers and record what it computes.

    /path/to/other/venv/bin/python scripts/hf_folder_check.py REQUEST.json OUT.pt
REQUEST.json: {NAME: {"folder": PATH, "ids": [[...], ...], "texts": ["...", ...]}, ...}.
OUT.pt (torch.save) holds, per NAME, the transformers version, the logits for ``ids`` and, per
text, the token ids and their decoding (or the error when the tokenizer refuses the text). This script never imports
scalelab, so it runs in any environment with torch + transformers (+ safetensors), such as a
venv with transformers 4.x; the caller compares OUT.pt with scalelab's own figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import transformers


def _encode(tok: Any, text: str) -> dict[str, Any]:
    try:
        ids = tok(text, add_special_tokens=False)["input_ids"]
    except Exception as e:  # a refusal is a result to compare, whatever its type
        return {"error": str(e)}
    decoded = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return {"ids": list(ids), "decoded": decoded}


def check(folder: str, req: dict[str, Any]) -> dict[str, Any]:
    config = transformers.AutoConfig.from_pretrained(folder)
    arch = config.architectures[0]
    # transformers renamed torch_dtype to dtype in 4.56; older 4.x only knows torch_dtype
    old = tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (4, 56)
    dtype_kw = {"torch_dtype" if old else "dtype": torch.float32}
    model = getattr(transformers, arch).from_pretrained(folder, **dtype_kw).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(req["ids"])).logits
    result: dict[str, Any] = {"transformers": transformers.__version__, "arch": arch,
                              "logits": logits, "texts": []}
    if (Path(folder) / "tokenizer.json").is_file():
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        result["tokenizer_class"] = type(tok).__name__
        result["texts"] = [_encode(tok, t) for t in req.get("texts", [])]
    return result


def main(request: str, out: str) -> None:
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    req = json.loads(Path(request).read_text())
    torch.save({name: check(r["folder"], r) for name, r in req.items()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
