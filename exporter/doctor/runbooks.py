"""Next steps for a verdict, taken from the runbook sections in ``docs/runbooks.md``.

Each alert's section has a "What to do" part (a paragraph or a list). The doctor shows its first
sentences, without Markdown links, so the advice stays written in one place. Where the docs are
not installed (a package without the repository) the runbook URL is all there is.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from exporter.alerting.thresholds import RUNBOOKS_PATH as RUNBOOKS

_WHAT_TO_DO = re.compile(r"^\*\*(?:Likely causes and what to do|What to do)[^*]*\*\*:?\s*(.*)$")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_URL_ALONE = re.compile(r"\s*\(<https?://[^>]+>\)")
_URL_AFTER = re.compile(r"[,:]\s*<https?://[^>]+>\)")
_URL = re.compile(r"<(https?://[^>]+)>")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`])")


@functools.lru_cache(maxsize=1)
def _sections(path: Path = RUNBOOKS) -> dict[str, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        else:
            current.append(line)
    return sections


def _clean(text: str) -> str:
    text = _LINK.sub(r"\1", text)
    text = _URL.sub(r"\1", _URL_AFTER.sub(")", _URL_ALONE.sub("", text)))
    return re.sub(r"\s+", " ", text).strip()


def _first_sentences(text: str, count: int) -> str:
    return " ".join(_SENTENCE.split(_clean(text))[:count])


def steps(alert: str, limit: int = 4) -> list[str]:
    """The first next steps of an alert's runbook section; empty without the docs."""
    lines = _sections().get(alert, [])
    found = [(i, _WHAT_TO_DO.match(line)) for i, line in enumerate(lines)]
    first = next(((i, match) for i, match in found if match), None)
    if first is None:
        return []
    start, match = first
    bullets: list[str] = []
    paragraph = [match.group(1)]
    for line in lines[start + 1 :]:
        if line.startswith("- "):
            bullets.append(line[2:])
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
        elif not line.strip():
            # A heading alone, or ending with a colon, introduces the list after the blank line.
            heading = " ".join(paragraph).strip()
            if bullets or (heading and not heading.endswith(":")):
                break
        elif not bullets:
            paragraph.append(line)
        else:
            break
    if bullets:
        return [_first_sentences(bullet, 1) for bullet in bullets[:limit]]
    text = " ".join(paragraph)
    return [sentence for sentence in _SENTENCE.split(_clean(text)) if sentence][:limit]


_XID_ROW = re.compile(r"^\|\s*(\d+)\s*\|([^|]*)\|([^|]*)\|([^|]*)\|\s*$")


@functools.lru_cache(maxsize=1)
def xid_table() -> dict[int, tuple[str, str]]:
    """XID code -> (meaning, usual action), from the table under GPUXidError; empty without it."""
    table: dict[int, tuple[str, str]] = {}
    for line in _sections().get("GPUXidError", []):
        row = _XID_ROW.match(line)
        if row:
            table[int(row.group(1))] = (_clean(row.group(2)), _clean(row.group(4)))
    return table
