"""scalelab writes no attribute it does not own and imports no private third-party name (ast
over src/scalelab).

An attribute write is an ``Assign``/``AugAssign``/``AnnAssign`` target or a ``setattr`` call
(``object.__setattr__`` included). Forbidden:

- a private name (``_x``, dunders included) on anything but ``self`` / ``cls``: that is another
  object's internals, a third-party class's most of all;
- a write through a private link of an attribute chain (``a._b.c = 1``, ``self.x._y.z = 1``):
  the object written to is reached through someone else's internals;
- any name on an imported third-party module or class (``torch.x = ...``,
  ``LightningModule.x = ...``, ``torch.nn.Module.x = ...``): that is patching it;
- importing a private third-party name (``from hydra.utils import _locate``) or from a private
  third-party module (``hydra._internal.utils``, ``import torch._dynamo``): neither is API, and
  either may change in any release.

Reads are not checked: scalelab reads tiktoken's ``_mergeable_ranks`` / ``_pat_str`` /
``_special_tokens`` because tiktoken's README extends an encoding that way.

A failure names the file, the line and the write or import.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "scalelab"
OWN = ("self", "cls")


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return bool(top) and top != "scalelab" and top not in sys.stdlib_module_names


def imported_names(tree: ast.AST) -> set[str]:
    """Names bound by imports of third-party modules (``import torch``, ``from torch import nn``,
    ``from pytorch_lightning import Trainer as T``), anywhere in the file."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if _third_party(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and _third_party(node.module or ""):
            names |= {a.asname or a.name for a in node.names}
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, dotted name) for each private third-party module or name imported."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if _third_party(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and _third_party(node.module or ""):
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if any(_private(part) for part in name.split(".")):
                yield node.lineno, name


def _chain(node: ast.AST) -> list[str]:
    """The attribute names from the root outwards: ``a._b.c`` -> ``['_b', 'c']``."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return names[::-1]


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        yield node


def attribute_writes(tree: ast.AST) -> Iterator[tuple[int, ast.AST, str | None]]:
    """(line, the object written to, the attribute name or None when not a literal)."""
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in (t for target in targets for t in _targets(target)):
            if isinstance(t, ast.Attribute):
                yield t.lineno, t.value, t.attr
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            f = node.func
            is_setattr = (isinstance(f, ast.Name) and f.id == "setattr") or (
                isinstance(f, ast.Attribute) and f.attr == "__setattr__")
            if is_setattr:
                name = node.args[1]
                literal = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
                yield node.lineno, node.args[0], literal


def violations(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename=filename)
    third_party = imported_names(tree)
    found = []
    for line, owner, attr in attribute_writes(tree):
        root = _root(owner)
        own = isinstance(owner, ast.Name) and owner.id in OWN
        write = f"{filename}:{line}: {ast.unparse(owner)}.{attr or '<dynamic>'}"
        if root in third_party:
            found.append(f"{write} (an attribute of the imported {root!r})")
        elif attr is not None and attr.startswith("_") and not own:
            found.append(f"{write} (a private attribute of an object that is not self/cls)")
        elif any(_private(name) for name in _chain(owner)[1 if root in OWN else 0:]):
            found.append(f"{write} (through a private attribute of an object that is not self/cls)")
    for line, name in private_imports(tree):
        found.append(f"{filename}:{line}: import of {name} (private to its package, not API)")
    return found


def test_no_file_in_src_writes_what_it_does_not_own() -> None:
    files = {str(p.relative_to(ROOT.parent)): p for p in sorted(ROOT.rglob("*.py"))}
    found = [v for name, path in files.items()
             for v in violations(path.read_text(encoding="utf-8"), name)]
    assert not found, "attribute writes on objects scalelab does not own:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "import torch\ntorch.optim.AdamW.step = lambda self: None",
    "from pytorch_lightning import LightningModule\nLightningModule.log = print",
    "from torch import nn as tnn\ntnn.Module.__setattr__ = object.__setattr__",
    "import pytorch_lightning as pl\nsetattr(pl.Trainer, 'fit', None)",
    "def f(trainer):\n    trainer._results = None",
    "def f(loop):\n    loop.epoch_loop._batches_that_stepped += 1",
    "def f(module, v):\n    object.__setattr__(module, '_current_fx_name', v)",
    "def f(a, b):\n    a.x, b._y = 1, 2",
    "def f(trainer):\n    trainer._signal_connector.received_sigterm = True",
    "class A:\n    def f(self):\n        self.trainer._connector.flag = True",
    "def f(a):\n    setattr(a._b, 'c', 1)",
    "from hydra._internal.utils import _locate",
    "from hydra.utils import _locate",
    "import torch._dynamo",
    "import torch.distributed.checkpoint._traverse as tr",
    "from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner",
])
def test_each_kind_of_foreign_write_is_caught(source: str) -> None:
    assert len(violations(source, "case.py")) == 1


@pytest.mark.parametrize("source", [
    "class A:\n    def f(self):\n        self._x = 1\n        self.y: int = 2",
    "class A:\n    @classmethod\n    def f(cls):\n        cls._n += 1",
    "import torch\ndef f(model: torch.nn.Module):\n    model.train(False)",
    "def f(counters):\n    counters.tokens += 1",
    "import sys\nsys.argv = ['x']",
    "class A:\n    def f(self):\n        self._cache.value = 1",
    "from torch.distributed.checkpoint import DefaultLoadPlanner\nfrom hydra.utils import get_object",
    "from os import _exit\nfrom . import _helpers\nfrom scalelab.data import _tokens",
    "import torch\nversion = torch.__version__\nfrom torch import __version__",
    "def f(enc):\n    return enc._mergeable_ranks",
])
def test_own_and_public_writes_pass(source: str) -> None:
    assert violations(source, "case.py") == []
