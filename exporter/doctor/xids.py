"""The XIDs each GPU reported, with their meaning from the runbooks' XID table.

Shown beside a verdict, never deciding it: GPUXidError and GPURecoveryActionRequired do that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.alerting.history import History
from exporter.alerting.thresholds import Thresholds
from exporter.doctor import runbooks


@dataclass(frozen=True)
class Xid:
    """XID errors of one code reported on a GPU, with their meaning from the runbooks."""

    code: int
    count: int
    meaning: str
    action: str
    # In GPUXidError's list: the alert pages on it.
    critical: bool

    def text(self, gpu: str) -> str:
        """``XID 79 on GPU 3: GPU has fallen off the bus``."""
        times = f" ({self.count} times)" if self.count > 1 else ""
        return f"XID {self.code} on GPU {gpu}{times}: {self.meaning or 'see the XID catalog'}"

    def to_json(self, gpu: str) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "gpu": int(gpu),
            "xid": self.code,
            "count": self.count,
            "meaning": self.meaning,
            "action": self.action,
            "critical": self.critical,
            "text": self.text(gpu),
        }


def reported(history: History, thresholds: Thresholds) -> dict[str, list[Xid]]:
    """GPU index -> the XIDs it reported (counted since the exporter started), worst first."""
    critical = set(thresholds.alert("GPUXidError").xids())
    table = runbooks.xid_table()
    found: dict[str, list[Xid]] = {}
    for labels, count in history.latest("gpu_xid_errors_total").items():
        label = dict(labels)
        code = label.get("xid", "")
        if not code.isdigit() or count <= 0 or "gpu" not in label:
            continue
        meaning, action = table.get(int(code), ("", ""))
        if meaning[1:2].islower():
            meaning = meaning[0].lower() + meaning[1:]
        xid = Xid(int(code), int(count), meaning, action, int(code) in critical)
        found.setdefault(label["gpu"], []).append(xid)
    return {
        gpu: sorted(x, key=lambda xid: (not xid.critical, xid.code)) for gpu, x in found.items()
    }
