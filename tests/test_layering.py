"""The package's layers, read from the source (``ast``): the day an import breaks one, this test fails.

- ``schedule/``, ``config/``, ``errors.py``, ``trace.py`` and the metric formulas (``metrics/formulas.py``; the
  torchmetrics classes live in ``metrics/torch_metrics.py``) are pure: no torch, Ray, vLLM or Lightning, anywhere in
  them;
- the top-level modules (``errors.py``, ``trace.py``, ``redaction.py``, ...) and ``config/`` are the base: they
  import no subpackage but the pure ``schedule/``, ``metrics/`` and ``config/``;
- ``lightning/`` holds only what imports Lightning; below it ``validation/`` (held-out scoring), ``run/`` (the run
  on rank 0: runtime, hybrid pool, workload) and ``training/`` (the GRPO math), each Lightning-free; ``training/``
  imports neither ``run/`` nor ``rollout/``, ``run/`` never ``validation/``;
- ``rollout/`` imports nothing from ``lightning/``, ``run/``, ``training/``, ``validation/``, ``sim/``, ``analysis/``
  or ``models/``; ``sim/`` nothing from
  ``rollout/``, ``lightning/`` or ``models/``; ``models/`` (model preparation) nothing from the runtime, the simulator
  or ``analysis/``; ``tasks/``, ``sources/``, ``rewards/``, ``agentic/`` and ``schedule/`` sit below all of those;
- ``analysis/`` (what reads a finished run) sits above ``sim/``: it may use the simulator's bound math
  (``sim/bound.py``: one formula for a simulated and a real run), never ``sim/cli.py``; ``sim/`` imports nothing from
  ``analysis/`` (the trace renderer both use, ``trace_plots.py``, is a top-level module beside ``trace.py``);
- no import cycle between the package's modules (imports inside functions and ``if TYPE_CHECKING:`` blocks count:
  a lazy or type-only import is still a dependency). The purity and layer rules ignore type-only imports.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lightning_hybrid_rollout"
NAME = PKG.name
HEAVY = ("torch", "ray", "vllm", "lightning", "transformers", "torchmetrics", "deepspeed", "numpy")
PURE = ("schedule", "config", "errors", "trace")
PURE_MODULES = (f"{NAME}.metrics", f"{NAME}.metrics.formulas")
UPPER = ("rollout", "lightning", "run", "training", "validation", "sim", "analysis", "models")
FORBIDDEN = {
    "rollout": ("lightning", "run", "training", "validation", "sim", "analysis", "models"),
    "training": ("lightning", "run", "validation", "sim", "analysis", "rollout"),
    "run": ("lightning", "validation", "sim", "analysis"),
    "validation": ("lightning", "sim", "analysis"),
    "sim": ("rollout", "lightning", "run", "training", "validation", "models", "analysis"),
    "analysis": ("rollout", "lightning", "run", "training", "validation", "models"),
    "models": ("rollout", "lightning", "run", "training", "validation", "sim", "analysis", "sources", "rewards"),
    "tasks": UPPER,
    "sources": UPPER,
    "rewards": (*UPPER, "sources", "tasks"),
    "agentic": (*UPPER, "sources", "tasks"),
    "schedule": (*UPPER, "tasks"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, type_only: bool = False) -> list[str]:
    """Every module ``path`` imports (absolute names); ``if TYPE_CHECKING:`` blocks only with ``type_only``."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.append(module)
            out.extend(f"{module}.{a.name}" for a in node.names)  # `from pkg import submodule`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _internal(target: str) -> str | None:
    """The package module ``target`` names (``a.b.c`` -> the longest known prefix), or None if external."""
    while target:
        if target in MODULES:
            return target
        target = target.rsplit(".", 1)[0] if "." in target else ""
    return None


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for target in _imports(path, type_only):
            dep = _internal(target) if target.startswith(NAME) else None
            if dep and dep != module and dep != NAME:
                graph[module].add(dep)
    return graph


def test_pure_layers_import_no_heavy_library() -> None:
    bad = []
    for module, path in MODULES.items():
        if _layer(module) not in PURE and module not in PURE_MODULES:
            continue
        for target in _imports(path):
            if target.split(".")[0] in HEAVY:
                bad.append(f"{module} imports {target}")
    assert not bad, bad


def _subpackages() -> set[str]:
    return {_layer(m) for m, p in MODULES.items() if p.name == "__init__.py" and m != NAME}


def test_layers_import_only_downwards() -> None:
    bad = []
    for module, deps in _graph().items():
        for dep in deps:
            if _layer(dep) in FORBIDDEN.get(_layer(module), ()):
                bad.append(f"{module} -> {dep}")
    assert not bad, bad


def _imports_lightning(path: Path) -> bool:
    return any(t.split(".")[0] in ("lightning", "pytorch_lightning") for t in _imports(path, type_only=True))


def test_every_module_under_lightning_imports_lightning() -> None:
    """``lightning/`` is the Lightning layer: a module that needs no Lightning belongs to ``run/``, ``training/`` or
    ``validation/`` (or its own package)."""
    bad = [
        m
        for m, p in MODULES.items()
        if _layer(m) == "lightning" and p.name != "__init__.py" and not _imports_lightning(p)
    ]
    assert not bad, bad


def test_lightning_free_packages_import_no_lightning() -> None:
    bad = [
        m
        for m, p in MODULES.items()
        if _layer(m) in ("run", "training", "validation") and any(t.split(".")[0] == "lightning" for t in _imports(p))
    ]
    assert not bad, bad


def test_top_level_modules_import_no_subpackage_but_the_pure_ones() -> None:
    top = [m for m, p in MODULES.items() if m.count(".") == 1 and p.name != "__init__.py"]
    assert {f"{NAME}.errors", f"{NAME}.trace"} <= set(top)
    base = top + [m for m in MODULES if _layer(m) == "config"]  # config/ is the base too
    allowed = {"schedule", "metrics", "config"}
    graph = _graph()
    bad = [f"{m} -> {d}" for m in base for d in graph.get(m, ()) if _layer(d) in _subpackages() - allowed]
    assert not bad, bad


def test_sim_and_analysis_import_one_way() -> None:
    """``analysis/`` may use ``sim/``'s bound math but never its command line; ``sim/`` never imports ``analysis/``."""
    graph = _graph()
    bad = []
    for module, deps in graph.items():
        for dep in deps:
            if _layer(module) == "sim" and _layer(dep) == "analysis":
                bad.append(f"{module} -> {dep} (sim/ reads no run: move the caller into analysis/)")
            if _layer(module) == "analysis" and dep == f"{NAME}.sim.cli":
                bad.append(f"{module} -> {dep} (analysis/ never uses the simulator's command line)")
    assert not bad, bad


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            connect(v)
    return found


def test_no_import_cycle_in_the_package() -> None:
    assert _cycles(_graph(type_only=True)) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_error_of_the_package_subclasses_one_base() -> None:
    import inspect

    import lightning_hybrid_rollout.errors as errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, BaseException)]
    assert len(classes) >= 10
    assert all(issubclass(c, errors.HybridRolloutError) for c in classes)
    defined_elsewhere = [
        f"{module}: class {node.name}"
        for module, path in MODULES.items()
        if module != f"{NAME}.errors"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in node.bases)
    ]
    assert not defined_elsewhere, defined_elsewhere


def test_the_architecture_map_names_every_module() -> None:
    """``docs/architecture.md`` is the map: every module of the package has its line in "Where things live"."""
    text = (PKG.parent / "docs" / "architecture.md").read_text()
    table = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    missing = [
        str(p.relative_to(PKG)) for p in sorted(PKG.rglob("*.py")) if f"`{p.relative_to(PKG).as_posix()}`" not in table
    ]
    assert not missing, f"docs/architecture.md's map misses {missing}"


def test_no_private_name_is_imported_from_another_module() -> None:
    """A name starting with ``_`` stays in its module: another module that needs it gets a public name."""
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(NAME)):
                offenders += [
                    f"{name}: {a.name} from {node.module}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not offenders, offenders


def test_the_callback_stays_a_thin_set_of_hooks() -> None:
    """The orchestration lives in ``run/hybrid_run.py``; the callback only hands each hook off to it."""
    lines = (PKG / "lightning" / "callback.py").read_text().count("\n")
    assert lines < 300, f"lightning/callback.py has {lines} lines: move the logic into run/hybrid_run.py"
