"""The package import graph runs one way (docs/architecture.md): a module imports only from its
own package and from the layers below it. Every `import` counts, also those inside functions.

The layering is data (LAYERS); the few edges that must stay against it are EXCEPTIONS, each
with its reason. A new edge against the flow fails here with the module and line that made it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rollstack"

LAYERS: list[set[str]] = [
    {"errors"},  # the core: the error tree, units and statistics, host facts, the layer format
    {"core", "interrupts"},
    {"contract"},  # the neutral API contract: service protocols, wire models, routes (pydantic only)
    {"host", "format"},
    {"store"},
    {"plan"},
    {"fetch"},
    {"lazystore"},
    {"lowers", "run"},  # layer stack -> lower dirs, beside one environment's OS side (never each other)
    {"provision"},
    {"node"},  # strings the stages together
    {"client"},  # the SDK over the node's HTTP API (the contract's routes and models)
    {"tasks"},  # tasks and their plans (pure), for everything above
    {"e2b"},  # the E2B-compatible API: a protocol adapter over one node
    {"integrations", "cluster"},  # consumers of nodes: never each other (the pool's gateway fronts its nodes' E2B API)
    {"cli"},  # may import anything
]
"""Bottom first. A package may import its own modules and any package of a lower layer."""

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("node", "e2b"): "node/api.py's create_app is the node agent's composition root: it mounts the "
                     "E2B-compatible API (a protocol adapter over the same NodeService) on the node's "
                     "listen address, imported lazily and only when the e2b extra is installed; e2b "
                     "itself talks to the service only (test_the_e2b_adapter_talks_to_the_service_only)",
}
"""(importing package, imported package) -> why this edge against the flow stays."""


def _level(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"package rollstack.{package} is not in LAYERS: place it in the flow")


def _package_of(module: Path) -> str:
    rel = module.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(module: Path) -> list[tuple[str, int]]:
    """(imported rollstack package, line) for every import in `module`."""
    tree = ast.parse(module.read_bytes(), str(module))
    out = []
    parts = module.relative_to(SRC).with_suffix("").parts
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = list(parts[: len(parts) - node.level])
                names = [".".join(["rollstack", *base, *([node.module] if node.module else [])])]
            else:
                names = [node.module or ""]
                if names[0] == "rollstack":  # `from rollstack import x`: x is the package
                    names = [f"rollstack.{a.name}" for a in node.names]
        for name in names:
            bits = name.split(".")
            is_part = len(bits) > 1 and ((SRC / bits[1]).is_dir() or (SRC / f"{bits[1]}.py").is_file())
            if bits[0] == "rollstack" and is_part:  # (not `from rollstack import __version__`)
                out.append((bits[1], node.lineno))
    return out


def violations() -> list[str]:
    found = []
    for module in sorted(SRC.rglob("*.py")):
        if module.parent == SRC and module.name == "__init__.py":
            continue
        pkg = _package_of(module)
        mine = _level(pkg)
        for target, line in _imports(module):
            if target == pkg or _level(target) < mine or pkg == "cli":
                continue
            if (pkg, target) in EXCEPTIONS:
                continue
            found.append(f"{module.relative_to(SRC.parent)}:{line}: rollstack.{pkg} imports rollstack.{target}")
    return found


def test_no_import_runs_against_the_flow() -> None:
    assert violations() == []


def test_every_package_is_placed_and_every_exception_is_still_needed() -> None:
    packages = {p.name.removesuffix(".py") for p in SRC.iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    for pkg in packages:
        _level(pkg)
    used = set()
    for module in SRC.rglob("*.py"):
        if module.parent == SRC and module.name == "__init__.py":
            continue
        pkg = _package_of(module)
        used |= {(pkg, t) for t, _ in _imports(module)}
    assert set(EXCEPTIONS) <= used, f"exceptions no longer needed: {set(EXCEPTIONS) - used}"


def test_an_edge_against_the_flow_is_found(tmp_path: Path, monkeypatch) -> None:
    import sys

    me = sys.modules[__name__]
    for pkg in ("store", "plan", "node"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "store" / "a.py").write_text("def f():\n    from rollstack.plan import refs\n")
    (tmp_path / "store" / "b.py").write_text("from ..node import service\nimport rollstack.store.a\n")
    (tmp_path / "plan" / "c.py").write_text("from rollstack import store\nfrom . import d\n")
    monkeypatch.setattr(me, "SRC", tmp_path)
    assert violations() == [f"{tmp_path.name}/store/a.py:2: rollstack.store imports rollstack.plan",
                            f"{tmp_path.name}/store/b.py:1: rollstack.store imports rollstack.node"]


BENCH = SRC.parent / "rollstack_bench"


def _all_imports(module: Path, root: Path, top: str, with_typing: bool = True) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in `module` (a file under `root`, the
    directory of package `top`), relative ones resolved; `with_typing=False` leaves out those
    under `if TYPE_CHECKING:` (never executed)."""
    tree = ast.parse(module.read_bytes(), str(module))
    parts = [top, *module.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts = parts[:-1] + ["__init__"]
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only and not with_typing:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(parts[: len(parts) - node.level] + ([node.module] if node.module else []))
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]  # `from pkg import module`
    return out


BESIDE = {"rollstack_bench": BENCH, "rollstack_corpus": SRC.parent / "rollstack_corpus",
          "rollstack_demo": SRC.parent / "rollstack_demo"}
"""Measurement and fixtures, packages beside the product: the benchmarks, the corpus builder, the demo."""


def test_the_product_never_imports_measurement_or_fixtures() -> None:
    """Only the CLI's `bench` and `demo` commands load the packages beside the product."""
    found = []
    for module in sorted(SRC.rglob("*.py")):
        if module.relative_to(SRC).parts[0] == "cli":
            continue
        for name, line in _all_imports(module, SRC, "rollstack"):
            if name.split(".")[0] in BESIDE:
                found.append(f"{module.relative_to(SRC.parent)}:{line}: {name}")
    assert found == []
    assert all((root / "__init__.py").is_file() for root in BESIDE.values())


def test_the_corpus_builder_never_imports_the_demo_or_the_benchmarks() -> None:
    found = [f"{m.relative_to(SRC.parent)}:{line}: {name}"
             for m in sorted(BESIDE["rollstack_corpus"].rglob("*.py"))
             for name, line in _all_imports(m, BESIDE["rollstack_corpus"], "rollstack_corpus")
             if name.split(".")[0] in ("rollstack_demo", "rollstack_bench")]
    assert found == []


def _module_cycles(root: Path, top: str) -> list[list[str]]:
    """Import cycles between the modules of each package under `root`: every executed import
    counts, also those inside functions (a cycle hidden in a function is still a knot to untie);
    type-only imports (`if TYPE_CHECKING:`) do not."""
    modules = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("").parts
        name = ".".join([top, *rel[:-1]] if rel[-1] == "__init__" else [top, *rel])
        modules[name] = path
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
        targets = set()
        for imported, _ in _all_imports(path, root, top, with_typing=False):
            if imported in modules and imported != name and imported.rsplit(".", 1)[0] == package \
                    and modules[imported].name != "__init__.py":
                targets.add(imported)
        edges[name] = targets
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return cycles


def test_no_import_cycles_inside_a_package() -> None:
    assert _module_cycles(SRC, "rollstack") == []
    for top, root in BESIDE.items():
        assert _module_cycles(root, top) == []


def test_the_e2b_adapter_talks_to_the_service_only() -> None:
    """e2b/ is a protocol adapter over the contract (`NodeLocal`): it never reaches into the
    stages (the node composes it; run/, lazystore/, lowers/, provision/ stay behind the service)."""
    stages = {"run", "node", "lazystore", "lowers", "provision", "fetch", "store", "plan", "host"}
    found = [f"{m.relative_to(SRC.parent)}:{line}: {t}" for m in sorted((SRC / "e2b").rglob("*.py"))
             for t, line in _imports(m) if t in stages]
    assert found == []
