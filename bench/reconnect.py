"""A slow client that reopens every connection the server closes, as fast as it is let.

`Reconnector` holds ``count`` connections to a server, each sending an opening (the start of a
request head, or a POST head announcing a body it never sends; nothing, to a TLS server, whose
handshake then waits) and nothing more. A connection the server ends (closed to make room for a
new one, or at its deadline) is opened again at once, at most ``rate`` times a second. With more
connections than the server holds, every connection it admits closes another, which comes back:
a churn of accepts and closes, where a client that only holds connections open makes none.

One thread, non-blocking sockets and a selector: a connection the server is slow to take does
not hold the others up. `Attack` runs one in a process of its own. Used by `bench.servers` (the
slow clients' table) and by tests/test_http_bounds.py.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
import selectors
import socket
import threading
import time
from typing import Any


class Reconnector(threading.Thread):
    """Keeps ``count`` slow connections open, reopening each one closed (``rate`` a second)."""

    def __init__(
        self, address: tuple[str, int], opening: bytes, *, count: int = 300, rate: float = 1000.0
    ) -> None:
        super().__init__(name="reconnector", daemon=True)
        self._address = address
        self._opening = opening
        self._count = count
        self._rate = rate
        self._stopping = threading.Event()
        self._selector = selectors.DefaultSelector()
        self.opened = 0  # connections opened, the first ``count`` included
        self.closed = 0  # connections the server ended (or refused)
        self.started_at = 0.0
        self.ended_at = 0.0

    @property
    def reconnects(self) -> int:
        """Connections opened again after the server ended one."""
        return max(self.opened - self._count, 0)

    def reconnect_rate(self) -> float:
        """Reconnects a second, over the time it ran (so far)."""
        end = self.ended_at or time.monotonic()
        return self.reconnects / max(end - self.started_at, 1e-9)

    def run(self) -> None:
        """Open, and reopen, until stopped; then close every connection."""
        live: set[socket.socket] = set()
        self.started_at = last = time.monotonic()
        budget = float(self._count)  # the first ``count`` at once, then ``rate`` a second
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                # A burst of at most a tenth of a second's worth after a pause.
                budget = min(budget + (now - last) * self._rate, max(budget, self._rate / 10))
                last = now
                while len(live) < self._count and budget >= 1:
                    budget -= 1
                    live.add(self._open())
                for key, _ in self._selector.select(timeout=0.005):
                    connection = key.fileobj
                    assert isinstance(connection, socket.socket)
                    if not self._serve(connection, key.data):
                        self._selector.unregister(connection)
                        connection.close()
                        live.discard(connection)
                        self.closed += 1
        finally:
            self.ended_at = time.monotonic()
            for connection in live:
                connection.close()
            self._selector.close()

    def _open(self) -> socket.socket:
        connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        connection.setblocking(False)
        connection.connect_ex(self._address)
        self._selector.register(connection, selectors.EVENT_WRITE, "connecting")
        self.opened += 1
        return connection

    def _serve(self, connection: socket.socket, state: str) -> bool:
        """Send the opening once connected; read and drop what comes. False once ended."""
        try:
            if state == "connecting":
                if connection.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    return False
                if self._opening:
                    connection.send(self._opening)
                # From now on, only the server's end of the connection matters.
                self._selector.modify(connection, selectors.EVENT_READ, "open")
                return True
            with contextlib.suppress(BlockingIOError):
                return connection.recv(1 << 16) != b""
        except OSError:  # reset, refused
            return False
        return True

    def stop(self) -> None:
        """Stop, and close every connection."""
        self._stopping.set()
        self.join()


def _attack(
    address: tuple[str, int], opening: bytes, count: int, rate: float, control: Any, so_far: Any
) -> None:
    """The attack process: reconnect until told to stop, then say how many times and how fast."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 100
    if soft < wanted and (hard == resource.RLIM_INFINITY or hard >= wanted):
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    attacker = Reconnector(address, opening, count=count, rate=rate)
    attacker.start()
    control.send("started")
    while not control.poll(0.05):
        so_far.value = attacker.reconnects
    control.recv()
    attacker.stop()
    control.send((attacker.reconnects, attacker.reconnect_rate()))


class Attack:
    """A `Reconnector` in a process of its own: the measuring process keeps its GIL to itself."""

    def __init__(
        self, address: tuple[str, int], opening: bytes, *, count: int = 1000, rate: float = 1000.0
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._control, theirs = context.Pipe()
        self._so_far = context.Value("q", 0)
        self._process = context.Process(
            target=_attack, args=(address, opening, count, rate, theirs, self._so_far), daemon=True
        )
        self.reconnects = 0
        self.rate = 0.0

    def start(self, timeout: float = 60.0) -> None:
        """Start the process; return once its connections are opening."""
        self._process.start()
        try:
            started = self._control.poll(timeout) and self._control.recv() == "started"
        except EOFError:  # the process ended
            started = False
        if not started:
            self.kill()
            raise RuntimeError("the reconnecting client did not start")

    def wait_for(self, reconnects: int, timeout: float) -> bool:
        """Wait until the attack has reconnected that many times; False if not in time."""
        deadline = time.monotonic() + timeout
        while self._so_far.value < reconnects:
            if time.monotonic() > deadline or not self._process.is_alive():
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the attack; `reconnects` and `rate` (a second) say what it did."""
        self._control.send("stop")
        if self._control.poll(timeout):
            self.reconnects, self.rate = self._control.recv()
        self.kill()

    def kill(self) -> None:
        """End the process, whatever it is doing."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join(timeout=30)
