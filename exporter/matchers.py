"""Alertmanager's label matchers, parsed once for the relay's routes and the inhibit rules.

``name="value"``, ``name!="value"``, ``name=~"regex"`` and ``name!~"regex"``, as Alertmanager's
classic parser reads them (pkg/labels/parse.go). A regex is compiled with RE2, as Alertmanager's
Go regexp is: its time is linear in the label's length whatever the pattern (``(a+)+$`` cannot
blow up), and what RE2 does not have (backreferences, lookaround) is refused here as there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Alertmanager's classic matcher (pkg/labels/parse.go): a label name, an operator (=~ before =,
# or `=` would take the `~` into the value), and a value, quoted or not, around any whitespace.
_MATCHER = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(=~|=|!=|!~)\s*(.*?)\s*$", re.DOTALL)
OPERATORS = ("=", "!=", "=~", "!~")
EXAMPLE = 'alertname="GPUFellOffBus"'


@dataclass(frozen=True)
class Matcher:
    """One label matcher: ``name``, an operator of :data:`OPERATORS` and ``value``."""

    name: str
    operator: str
    value: str
    # The value anchored at both ends, as Alertmanager compiles it, for =~ and !~ (RE2).
    regex: Any = field(default=None, compare=False, repr=False)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this matcher; a missing label is the empty string."""
        actual = labels.get(self.name, "")
        if self.regex is not None:
            return (self.regex.fullmatch(actual) is not None) == (self.operator == "=~")
        return (actual == self.value) == (self.operator == "=")

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.operator}"{escaped}"'


def parse_matchers(text: str) -> list[Matcher]:
    """Parse one entry of ``source_matchers`` or ``target_matchers`` as Alertmanager does.

    An entry holds one matcher (``alertname="GPUFellOffBus"``) or several separated by commas
    outside quotes, optionally inside braces (``{alertname="A", gpu!="0"}``).

    Raises:
        ValueError: a matcher is malformed or its regex does not compile; the message says how.
    """
    body = text.removeprefix("{").removesuffix("}")
    tokens: list[str] = []
    token: list[str] = []
    quoted = escaped = False
    for char in body:
        if char == ",":
            if not quoted:
                tokens.append("".join(token))
                token = []
                continue
        elif char == '"':
            if escaped:
                escaped = False
            else:
                quoted = not quoted
        elif char == "\\":
            escaped = not escaped
        else:
            escaped = False
        token.append(char)
    if "".join(token).strip():
        tokens.append("".join(token))
    if not tokens:
        raise ValueError(f"{text!r} holds no matcher: expected one like {EXAMPLE}")
    return [parse_matcher(token) for token in tokens]


def parse_matcher(text: str) -> Matcher:
    r"""Parse one matcher: a label name, ``=``, ``!=``, ``=~`` or ``!~``, and a value.

    The value may be double-quoted; inside it ``\"``, ``\n`` and ``\\`` are escapes, and an
    unescaped ``"`` may only close a quoted value. A regex must match the whole label value.

    Raises:
        ValueError: ``text`` is not such a matcher, or its regex does not compile.
    """
    match = _MATCHER.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a matcher: expected a label name, one of"
            f" {' '.join(OPERATORS)} and a value, like {EXAMPLE}"
        )
    name, operator, raw = match.groups()
    try:
        value = _unquote(raw)
    except ValueError as error:
        raise ValueError(f"{text!r}: {error}") from error
    if operator not in ("=~", "!~"):
        return Matcher(name, operator, value)
    # Imported here: RE2 costs 2.7 MB of resident memory, which `gpuload serve` spends only
    # when its rules hold a regex matcher (the shipped ones hold none).
    import re2

    quiet = re2.Options()
    quiet.log_errors = False  # the error goes in the one line below, not also to stderr
    try:
        regex = re2.compile(f"(?:{value})", options=quiet)
    except re2.error as error:
        reason = error.args[0] if error.args else ""
        reason = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise ValueError(
            f"{text!r}: {value!r} is not a regex RE2 (and Alertmanager) accepts: {reason}"
        ) from None
    return Matcher(name, operator, value, regex)


def _unquote(raw: str) -> str:
    """The value of a matcher with its quotes and escapes undone, as Alertmanager reads them."""
    quoted = raw.startswith('"')
    body = raw[1:] if quoted else raw
    value: list[str] = []
    closed = False
    index = 0
    while index < len(body):
        char = body[index]
        last = index == len(body) - 1
        if char == "\\" and not last:
            following = body[index + 1]
            # A spurious escape (not \n, \" or \\) stays a literal backslash.
            value.append({"n": "\n", '"': '"', "\\": "\\"}.get(following, "\\" + following))
            index += 2
            continue
        if char == '"':
            if not quoted or not last:
                raise ValueError(r"an unescaped double quote inside the value (write \" for one)")
            closed = True
        else:
            value.append(char)
        index += 1
    if quoted and not closed:
        raise ValueError("the value's opening double quote is never closed")
    return "".join(value)
