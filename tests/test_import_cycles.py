"""No import cycle in the runtime package, counting the imports placed inside functions.

An import inside a function still makes its module depend on the one it imports: placed there to
get past a cycle, it only moves the cycle's failure from start-up to the first call. Imports
inside functions that keep a heavy module (bcrypt, jinja2, grpc) out of a process that does not
need it are fine, as long as they close no cycle. `if TYPE_CHECKING:` imports are left out: they
never run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from helpers import ROOT


def modules_of(package: Path) -> dict[str, Path]:
    """Module name -> file, for every module under ``package`` (a folder on the import path)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imported(
    module: str, node: ast.Import | ast.ImportFrom, is_package: bool, modules: dict[str, Path]
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join([*here, base] if base else here)
    for alias in node.names:
        # `from a import b`: the module a.b where there is one, else a name in the module a.
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in modules else base


def imports_of(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports, at any depth but `if TYPE_CHECKING:`."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        nodes = [ast.parse(path.read_text())]
        while nodes:
            for child in ast.iter_child_nodes(nodes.pop()):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, ast.Import | ast.ImportFrom):
                    edges.update(_imported(name, child, is_package, modules))
                nodes.append(child)
        graph[name] = {target for target in edges if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_runtime_package_and_the_tooling_have_no_import_cycle() -> None:
    assert cycles(imports_of(modules_of(ROOT / "exporter"))) == []
    assert cycles(imports_of(modules_of(ROOT / "tools"))) == []


def test_the_runtime_never_imports_the_build_and_check_tooling() -> None:
    """tools/ is not installed: an import of it from exporter/ fails in the image, not here."""
    modules = {**modules_of(ROOT / "exporter"), **modules_of(ROOT / "tools")}
    graph = imports_of(modules)
    reaching = {
        module: sorted(target for target in graph[module] if target.split(".")[0] == "tools")
        for module in graph
        if module.split(".")[0] == "exporter"
    }
    assert {module: targets for module, targets in reaching.items() if targets} == {}
    assert any(graph[module] for module in graph if module.startswith("tools."))


def test_a_cycle_closed_by_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def later():\n    from pkg import a\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    )
    (package / "d.py").write_text("from . import c\n")
    graph = imports_of(modules_of(package))
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert graph["pkg.c"] == set() and graph["pkg.d"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
