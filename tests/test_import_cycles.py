"""No import cycle in the runtime package, and no module importing a layer above its own.

An import inside a function still makes its module depend on the one it imports: placed there to
get past a cycle, it only moves the cycle's failure from start-up to the first call. Imports
inside functions that keep a heavy module (bcrypt, jinja2, grpc) out of a process that does not
need it are fine, as long as they close no cycle and go down the layers. `if TYPE_CHECKING:`
imports are left out of the cycles (they never run, so they cannot close one at import time) but
obey the layers: a type from a layer above, in a signature below, is the layering upside down.
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


def imports_of(modules: dict[str, Path], *, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports, at any depth.

    `if TYPE_CHECKING:` imports are counted only with ``type_checking``.
    """
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        nodes = [ast.parse(path.read_text())]
        while nodes:
            for child in ast.iter_child_nodes(nodes.pop()):
                is_type_checking = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(
                    child.test
                )
                if is_type_checking and not type_checking:
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


# The runtime's parts, bottom to top (docs/architecture.md, "Layers"): a module imports from its
# own part, its own layer and the layers below, never from above. A part is a package or a module
# directly under exporter/ ("exporter" is the package's __init__, with __version__).
LAYERS = (
    # Foundations: names, logging, settings parsing, matchers; none knows GPUs or HTTP.
    ("exporter", "names", "logs", "problems", "matchers", "settings", "workers"),
    # The outside world's clients: the driver (the only pynvml caller), the kubelet.
    ("nvml", "kubernetes"),
    # The simulated NVML (installed under pynvml) and its recorder, which reads the real one.
    ("sim",),
    # HTTP for both daemons: the server, the web config file, the answers, the signals.
    ("web",),
    # Collection: collectors -> snapshot -> session -> cycle -> collection.
    ("collectors",),
    ("snapshot",),
    ("session",),
    ("cycle",),
    ("collection",),
    # The relay: its queue and delivery serve gpuload relay and the exporter's own alerts.
    ("relay",),
    # Thresholds, the rule evaluator, local alerting (which delivers through the relay).
    ("alerting",),
    # `gpuload serve`'s configuration (its alerting section is read in the relay's format).
    ("config",),
    # The commands: the exporter's daemon, the doctor, the command line.
    ("server",),
    ("doctor", "report"),
    ("cli", "__main__"),
)


def part_of(module: str, root: str) -> str:
    """The part of a module: ``exporter.relay.targets.slack`` -> ``relay``; the root is its own."""
    names = module.split(".")
    return names[1] if len(names) > 1 else root


def upward_imports(
    graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...], root: str
) -> list[str]:
    """Each import of a module from a layer above its own, said as a sentence, sorted."""
    level = {part: index for index, layer in enumerate(layers) for part in layer}
    found = []
    for module, targets in graph.items():
        here = part_of(module, root)
        for target in targets:
            there = part_of(target, root)
            if level[there] > level[here]:
                found.append(f"{module} imports {target}: {there} stands above {here}")
    return sorted(found)


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


def test_every_part_of_the_runtime_has_its_place_in_the_layers() -> None:
    parts = {part_of(module, "exporter") for module in modules_of(ROOT / "exporter")}
    listed = [part for layer in LAYERS for part in layer]
    assert len(listed) == len(set(listed)), "a part listed twice"
    assert parts == set(listed)


def test_no_runtime_module_imports_a_layer_above_its_own() -> None:
    # Counting the imports inside functions and under `if TYPE_CHECKING:`.
    graph = imports_of(modules_of(ROOT / "exporter"), type_checking=True)
    assert upward_imports(graph, LAYERS, "exporter") == []


def test_an_upward_import_inside_a_function_or_for_type_checking_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "web").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "web" / "__init__.py").write_text("")
    (package / "web" / "server.py").write_text("def later():\n    from pkg.relay import queue\n")
    (package / "web" / "answers.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import relay\n"
    )
    (package / "relay.py").write_text("from pkg.web import server\n")
    graph = imports_of(modules_of(package), type_checking=True)
    assert upward_imports(graph, (("pkg",), ("web",), ("relay",)), "pkg") == [
        "pkg.web.answers imports pkg.relay: relay stands above web",
        "pkg.web.server imports pkg.relay: relay stands above web",
    ]
