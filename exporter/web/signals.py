"""How both daemons stop: SIGTERM (a kubelet, systemd) or SIGINT (Ctrl-C) sets their stop event.

`gpuload serve` and `gpuload relay` install the same handler, so they stop, and say so, alike.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)


def stop_on_signals(stop: threading.Event) -> None:
    """Set ``stop`` on SIGTERM or SIGINT; the daemon's main thread waits on it and shuts down.

    Python runs a handler on the main thread only, once that thread wakes: the daemon's main
    thread must wait on ``stop`` (or on something as short), never block for ever.
    """

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
