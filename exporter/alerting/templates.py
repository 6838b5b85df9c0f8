"""The part of Prometheus's alert templating that gpuload's rules use, for the local evaluator.

The rules' annotations are Go text/template with Prometheus's functions. Locally they are rendered
by this small interpreter so that a local alert reads exactly like the one Prometheus sends:
``{{ $labels.NAME }}``, ``{{ $value }}`` piped to ``humanize``, ``humanizePercentage``,
``humanizeDuration`` or ``printf "FORMAT"``, ``{{ with X }}...{{ . }}...{{ end }}`` and
``{{ if X }}...{{ else }}...{{ end }}``. Anything else raises :class:`TemplateError`, so a rule
that starts using more of the language fails a test instead of rendering wrongly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
_STRING = re.compile(r'^"((?:[^"\\]|\\.)*)"$')


class TemplateError(ValueError):
    """The template uses something this interpreter does not implement."""


@dataclass
class _Node:
    kind: str  # "text", "print", "if", "with"
    text: str = ""
    body: list[_Node] = field(default_factory=list)
    otherwise: list[_Node] = field(default_factory=list)


def _parse(template: str) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[_Node | None, list[_Node]]] = [(None, root)]
    position = 0
    for match in _ACTION.finditer(template):
        if match.start() > position:
            stack[-1][1].append(_Node("text", template[position : match.start()]))
        position = match.end()
        action = match.group(1)
        keyword, _, rest = action.partition(" ")
        if keyword in ("if", "with"):
            node = _Node(keyword, rest.strip())
            stack[-1][1].append(node)
            stack.append((node, node.body))
        elif keyword == "else":
            owner = stack[-1][0]
            if owner is None:
                raise TemplateError("{{ else }} outside if/with")
            stack[-1] = (owner, owner.otherwise)
        elif keyword == "end":
            if len(stack) == 1:
                raise TemplateError("{{ end }} without if/with")
            stack.pop()
        else:
            stack[-1][1].append(_Node("print", action))
    if len(stack) != 1:
        raise TemplateError("if/with without {{ end }}")
    if position < len(template):
        root.append(_Node("text", template[position:]))
    return root


@dataclass(frozen=True)
class _Scope:
    labels: Mapping[str, str]
    value: float
    dot: object = None


def _operand(text: str, scope: _Scope) -> object:
    if text == "$value":
        return scope.value
    if text == ".":
        return scope.dot
    if text.startswith("$labels."):
        return scope.labels.get(text.removeprefix("$labels."), "")
    string = _STRING.match(text)
    if string:
        return string.group(1).encode().decode("unicode_escape")
    raise TemplateError(f"unsupported operand {text!r}")


def _pipeline(text: str, scope: _Scope) -> object:
    stages = [stage.strip() for stage in text.split("|")]
    value = _operand(stages[0], scope)
    for stage in stages[1:]:
        function, _, argument = stage.partition(" ")
        value = _call(function, argument.strip(), value, scope)
    return value


def _call(function: str, argument: str, value: object, scope: _Scope) -> str:
    if function == "printf":
        return go_printf(str(_operand(argument, scope)), _number(value))
    if argument:
        raise TemplateError(f"unsupported arguments to {function}")
    if function == "humanize":
        return humanize(_number(value))
    if function == "humanizePercentage":
        return humanize_percentage(_number(value))
    if function == "humanizeDuration":
        return humanize_duration(_number(value))
    raise TemplateError(f"unsupported function {function!r}")


def _number(value: object) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        raise TemplateError(f"{value!r} is not a number") from None


def _show(value: object) -> str:
    if isinstance(value, float):
        return _go_float(value)
    return str(value)


def _go_float(value: float) -> str:
    # Go prints a float64 with %v: the shortest representation, exponent from 1e21 up.
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    return text.replace("e-0", "e-").replace("e+0", "e+")


def _truthy(value: object) -> bool:
    if isinstance(value, float):
        return value != 0
    return bool(value)


def _render(nodes: list[_Node], scope: _Scope) -> str:
    out = []
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "print":
            out.append(_show(_pipeline(node.text, scope)))
        else:
            value = _pipeline(node.text, scope)
            if _truthy(value):
                inner = _Scope(scope.labels, scope.value, value) if node.kind == "with" else scope
                out.append(_render(node.body, inner))
            else:
                out.append(_render(node.otherwise, scope))
    return "".join(out)


def render(template: str, labels: Mapping[str, str], value: float) -> str:
    """Render an annotation template as Prometheus would for an alert with these labels and value.

    Raises:
        TemplateError: the template uses a construct this interpreter does not implement.
    """
    return _render(_parse(template), _Scope(labels, value))


def go_g4(value: float) -> str:
    """Go's ``%.4g``, which drops trailing zeros like Python's but spells exponents alike."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"


def humanize(value: float) -> str:
    """Prometheus's ``humanize``: SI prefixes, four significant digits."""
    if value == 0 or math.isnan(value) or math.isinf(value):
        return go_g4(value)
    prefix = ""
    if abs(value) >= 1:
        for candidate in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(value) < 1000:
                break
            prefix = candidate
            value /= 1000
        return f"{go_g4(value)}{prefix}"
    for candidate in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix = candidate
        value *= 1000
    return f"{go_g4(value)}{prefix}"


def humanize_percentage(value: float) -> str:
    """Prometheus's ``humanizePercentage``: a ratio as a percentage, four significant digits."""
    return f"{go_g4(value * 100)}%"


def humanize_duration(value: float) -> str:
    """Prometheus's ``humanizeDuration``: seconds as ``1d 2h 3m 4s``."""
    if math.isnan(value) or math.isinf(value):
        return go_g4(value)
    if abs(value) >= 1:
        sign = "-" if value < 0 else ""
        value = abs(value)
        whole = int(value)
        days, hours = whole // 86400, whole // 3600 % 24
        minutes, seconds = whole // 60 % 60, whole % 60
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{go_g4(value)}s"
    prefix = ""
    for candidate in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if value == 0 or abs(value) >= 1:
            break
        prefix = candidate
        value *= 1000
    return f"{go_g4(value)}{prefix}s"


def go_printf(form: str, value: float) -> str:
    """Go's ``printf`` for the one-number float verbs the rules use (``%.0f``, ``%.2f``)."""
    if not re.fullmatch(r"[^%]*%\.?\d*[fg][^%]*", form):
        raise TemplateError(f"unsupported printf format {form!r}")
    return form % value
