"""No function of exporter/alerting/ is longer than a screen: each is small enough to read whole.

A function's length is its ``def``'s full span, its docstring and nested functions included,
its decorators not.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

ALERTING = ROOT / "exporter" / "alerting"
LONGEST_LINES = 60


def function_lengths(path: Path) -> list[tuple[str, int]]:
    """Each function of a module (methods and nested ones too), with its length in lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        (node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_the_length_counts_the_whole_def_without_its_decorators(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        "@decorator\ndef outer() -> None:\n    def inner() -> None:\n        pass\n\n    inner()\n"
    )
    assert function_lengths(module) == [("outer", 5), ("inner", 2)]


def test_no_function_in_alerting_is_over_the_limit() -> None:
    too_long = [
        f"{path.relative_to(ROOT).as_posix()}: {name} has {length} lines"
        for path in sorted(ALERTING.glob("*.py"))
        for name, length in function_lengths(path)
        if length > LONGEST_LINES
    ]
    assert too_long == [], f"functions over {LONGEST_LINES} lines: split them"
