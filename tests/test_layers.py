"""The layer rules of DESIGN.md, read from the imports (ast over src/scalelab).

Every ``import`` counts, at module level and inside functions: a lazy import is still an arrow.
A failure names the file and the arrow (``importer -> imported``).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "scalelab"
MAX_FUNCTION_LINES = 60
LONG_MARK = "# long:"  # on the def line or the line above: why this function may be longer
NEVER_IMPORT_CLI = ("scaling", "training", "data", "model", "tracking")


@dataclass(frozen=True)
class Arrow:
    src: str  # importing module, e.g. scalelab.scaling.plan
    dst: str  # imported module, e.g. scalelab.training.schedules or torch.nn
    file: Path
    line: int

    def __str__(self) -> str:
        return f"{self.file.relative_to(SRC.parent)}:{self.line}: {self.src} -> {self.dst}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def arrows_of(name: str, path: Path) -> Iterator[Arrow]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block)
                   for stmt in block.body for n in ast.walk(stmt)}  # type: ignore[attr-defined]
    for node in ast.walk(tree):  # module level and inside functions alike
        if id(node) in typing_only:  # `if TYPE_CHECKING:` imports never run
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Arrow(name, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, name, path.name == "__init__.py")
            for alias in node.names:  # `from pkg import submodule` is an arrow to the submodule
                sub = f"{target}.{alias.name}"
                yield Arrow(name, sub if sub in modules() else target, path, node.lineno)


@cache
def arrows() -> tuple[Arrow, ...]:
    return tuple(a for name, path in modules().items() for a in arrows_of(name, path))


def top(name: str) -> str:
    return name.split(".")[0]


def package(name: str) -> str:
    """scalelab.data.shards -> data; scalelab.paths -> paths (a ground-floor module)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def internal(a: Arrow) -> bool:
    return top(a.dst) == "scalelab" and a.dst != "scalelab"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _cycle_report(comp: list[str], key, found: list[Arrow]) -> str:
    members = set(comp)
    inside = sorted({str(a) for a in found if key(a.src) in members and key(a.dst) in members
                     and key(a.src) != key(a.dst)})
    return f"circle {' <-> '.join(comp)}:\n    " + "\n    ".join(inside)


def _fail_if(problems: list[str], rule: str) -> None:
    problems = sorted(set(problems))
    if problems:
        pytest.fail(f"{rule} ({len(problems)}):\n  " + "\n  ".join(problems), pytrace=False)


# --- the rules ----------------------------------------------------------------------------------
def test_model_imports_only_torch_and_the_stdlib() -> None:
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    bad = [str(a) for a in arrows() if package(a.src) == "model"
           and not (top(a.dst) in allowed or a.dst == "scalelab.model"
                    or a.dst.startswith("scalelab.model."))]
    _fail_if(bad, "model/ may import only torch, the standard library and itself")


def test_only_tracking_imports_mlflow() -> None:
    bad = [str(a) for a in arrows() if top(a.dst) == "mlflow" and package(a.src) != "tracking"]
    _fail_if(bad, "only tracking/ may import mlflow")


def test_lower_layers_never_import_cli() -> None:
    bad = [str(a) for a in arrows() if package(a.src) in NEVER_IMPORT_CLI
           and internal(a) and package(a.dst) == "cli"]
    _fail_if(bad, f"{', '.join(p + '/' for p in NEVER_IMPORT_CLI)} must not import cli/")


def test_no_circle_between_packages() -> None:
    found = [a for a in arrows() if internal(a) and package(a.src) != package(a.dst)]
    edges: dict[str, set[str]] = {}
    for a in found:
        edges.setdefault(package(a.src), set()).add(package(a.dst))
    bad = [_cycle_report(c, package, found) for c in cycles(edges)]
    _fail_if(bad, "import circles between packages")


def test_no_circle_between_modules_of_a_package() -> None:
    found = [a for a in arrows() if internal(a) and package(a.src) == package(a.dst)
             and a.dst in modules() and a.src != a.dst]
    edges: dict[str, set[str]] = {}
    for a in found:
        edges.setdefault(a.src, set()).add(a.dst)
    bad = [_cycle_report(c, str, found) for c in cycles(edges)]
    _fail_if(bad, "import circles between modules of one package")


def long_functions() -> Iterator[str]:
    for path in modules().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = node.end_lineno - node.lineno + 1
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            said = [lines[node.lineno - 1], lines[first - 2] if first >= 2 else ""]
            if n > MAX_FUNCTION_LINES and not any(LONG_MARK in s for s in said):
                yield f"{path.relative_to(SRC.parent)}:{node.lineno}: {node.name} has {n} lines"


def test_no_function_over_60_lines_without_a_reason() -> None:
    _fail_if(list(long_functions()),
             f"functions over {MAX_FUNCTION_LINES} lines (split them, or say why with "
             f"'{LONG_MARK} ...' on the def line or the line above)")


# --- the checker itself -------------------------------------------------------------------------
def test_the_checker_sees_function_level_and_relative_imports() -> None:
    f = SRC / "scalelab" / "scaling" / "report.py"
    got = {a.dst for a in arrows_of("scalelab.scaling.report", f)}
    assert "scalelab.scaling.fit" in got  # `from .fit import ...`
    lazy = ROOT / "scaling" / "heldout.py"
    assert "scalelab.training.checkpoint" in {a.dst for a in arrows_of("scalelab.scaling.heldout", lazy)}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    typing_only = ROOT / "model" / "accounting.py"  # imports ModelConfig under TYPE_CHECKING
    assert "scalelab.model.config" not in {a.dst for a in arrows_of("scalelab.model.accounting", typing_only)}


def test_every_scalelab_import_names_a_module_that_exists() -> None:
    """A rename that misses an import inside a function only fails when that path runs (the
    tune stage's `from .run import ...` after run.py became launch.py); found here from the source."""
    _fail_if([str(a) for a in arrows() if internal(a) and a.dst not in modules()],
             "every scalelab import must name a module that exists")
