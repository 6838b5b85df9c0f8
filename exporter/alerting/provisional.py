"""Provisional verdicts: the shipped rules rendered with shorter windows, while theirs fill.

The rules judge on 5-minute means, which a start does not have for 6 minutes. Until then the
status page gives verdicts from the same rules, rendered from the same thresholds file with these
windows (as the fleet recipe test renders them): a 1-minute window, 20-second short windows and no
``for:`` longer than 20 seconds. They are not a second definition: the conditions, thresholds and
states are the rules' own; only the time they look back is shorter, so each such verdict is marked
provisional and its alerts are never notified.
"""

from __future__ import annotations

from dataclasses import replace

from exporter.alerting.thresholds import Thresholds, duration_seconds

WINDOW = "1m"
SHORT_WINDOW = "20s"
GAP_TOLERANCE = "30s"
# The longest ``for:`` a provisional alert waits.
LONGEST_FOR = "20s"


def thresholds(shipped: Thresholds) -> Thresholds:
    """``shipped`` with the provisional windows and no ``for:`` longer than :data:`LONGEST_FOR`."""
    longest = duration_seconds(LONGEST_FOR)
    alerts = {
        name: alert if duration_seconds(alert.for_) <= longest else replace(alert, for_=LONGEST_FOR)
        for name, alert in shipped.alerts.items()
    }
    return replace(
        shipped,
        window=WINDOW,
        short_window=SHORT_WINDOW,
        gap_tolerance=GAP_TOLERANCE,
        alerts=alerts,
    )
