"""Imports go one way: core <- buffer <- rollout <- trainer <- plugins <- run, and no module cycle anywhere.

Every import counts, also those inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slime_like", "rollout", "buffer", "plugins")
# Lowest first; a module belongs to the layer of its longest matching prefix.
LAYERS = {
    "slime_like.core": 0,
    "buffer": 1,
    "rollout": 2,
    "slime_like.trainer": 3,  # Megatron ranks, algorithms, weight updates, their flags
    "plugins": 4,
    # Adapters for plugins written for slime, imported (as `slime`) only by the loader's finder, by name.
    "slime_like.compat": 4,
    "slime_like": 5,  # the run layer: loops, placement, arguments, actor groups, metrics
}
NAMES = ["core", "buffer", "rollout", "trainer", "plugins", "run"]


def modules() -> dict[str, Path]:
    """Every module of ours by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (resolved to the longest existing module name)."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets += [base] + [f"{base}.{a.name}" for a in node.names]
        graph[name] = {t for t in map(resolve, targets) if t and t != name}
    return graph


def layer(module: str) -> int:
    """The layer index of a module."""
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def test_imports_only_go_down() -> None:
    upward = [
        f"{m} ({NAMES[layer(m)]}) imports {t} ({NAMES[layer(t)]})"
        for m, targets in import_graph().items()
        for t in targets
        if layer(t) > layer(m)
    ]
    assert not upward, "imports against the layer direction:\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    graph = import_graph()
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_check_sees_a_violation() -> None:
    """The layer map itself: the graph is read (the core is imported) and an upward edge would be caught."""
    graph = import_graph()
    assert any("slime_like.core.sample" in targets for targets in graph.values())
    assert layer("slime_like.core.sample") < layer("buffer.buffer") < layer("rollout.manager")
    assert layer("rollout.manager") < layer("slime_like.trainer.weights.base") < layer("plugins.tool_agent")
    assert layer("plugins.tool_agent") < layer("slime_like.run")


def test_only_the_client_talks_http_to_engines() -> None:
    """SGLang and router endpoints are called from rollout/sglang_client.py alone."""
    allowed = {
        "rollout.sglang_client",
        "rollout.rm_hub.remote",  # a remote reward model, not an engine
        "slime_like.core.process",  # waits until any child process's URL answers (readiness, no endpoint logic)
        # slime's generic post/get for plugin code (tool servers, the router URL slime plugins build themselves)
        "slime_like.compat.slime.utils.http_utils",
    }
    offenders = []
    for name, path in modules().items():
        text = path.read_text()
        for marker in ("requests.post(", "requests.get(", "requests.delete(", "session.post(", "session.get("):
            if marker in text and name not in allowed:
                offenders.append(f"{name}: {marker}")
    assert not offenders, offenders
