"""``python -m bench.servers``: gpuload's own HTTP server against maintained ones, same app.

Whether `exporter.web.server.Server` (hand-written, a thread per connection) earns its keep
against cheroot (a pool of 16 threads), waitress (16 threads) and gunicorn (1 ``gthread`` worker,
16 threads). Each serves the same WSGI application, gpuload's /metrics over a simulated
16 x H100 node collected every second with every collector on, in one process of its own
(gunicorn: its master and its worker) started by `bench/serve_with.py`, one server at a time, in
alternating order over the rounds. gpuload's own server runs in that same process, as the others
do, so that only the server differs.

Then (unless ``--no-slow-clients``) what slow clients do to each server: 300 connections that
trickle a request head a byte a second, or a POST body a byte a second, from one thread, and
whether 10 legitimate requests are still answered meanwhile (a fresh server process for each);
then 1,000 such connections reopened as soon as the server ends them, up to 1,000 a second
(bench/reconnect.py), and how long 20 legitimate requests wait for an answer meanwhile.

The other servers live in bench/.venv-servers (git-ignored; created on the first run with
gpuload installed editable), never in gpuload's dependencies.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from bench import load, report
from bench.node import BENCH, CLOCK_TICKS, ROOT, ProcessTree, free_port, peer_version
from bench.reconnect import Attack
from bench.serve_with import SERVERS, THREADS

HEADING = report.SERVERS_HEADING
VENV = BENCH / ".venv-servers"
PACKAGES = ("cheroot", "waitress", "gunicorn")
# What each package installs in bin/: their presence says the venv is complete.
SCRIPTS = ("cheroot", "waitress-serve", "gunicorn")
SCENARIO = BENCH / "scenarios" / "h100x16.yaml"
WARM_UP = 3.0  # past start-up: imports, discovery, the first slow reads
IDLE = 6.0  # CPU without scrapes: what the server costs while nobody asks
WINDOW = 12.0  # the 10 scrapers' window
SCRAPERS = 10
ALONE = 200  # back-to-back scrapes of the lone scraper
# (key, heading, format)
COLUMNS = (
    ("p99_1", "p99 1 scraper ms", "{:.2f}"),
    ("p50_10", "p50 10 ms", "{:.2f}"),
    ("p99_10", "p99 10 ms", "{:.2f}"),
    ("scrapes_per_s", "scrapes/s 10", "{:.0f}"),
    ("cycles_10", "cycles 10", "{:.0f}"),
    ("cpu_ms_per_cycle", "CPU ms/cycle 10", "{:.1f}"),
    ("idle_cpu_ms_per_cycle", "CPU ms/cycle idle", "{:.1f}"),
    ("cpu_ms_per_scrape", "CPU ms/scrape", "{:.3f}"),
    ("rss_mb", "RSS MB", "{:.1f}"),
    ("pss_mb", "PSS MB", "{:.1f}"),
    ("others_cpus", "others' CPUs", "{:.2f}"),
)
# Before each server starts, wait (at most QUIET_WAIT seconds) until the rest of the machine
# uses less than QUIET_CPUS: on a shared 2-CPU machine a test run beside would skew the figures.
QUIET_WAIT = 10.0
QUIET_CPUS = 0.3
# Slow clients: SLOW connections trickle a byte a second for SLOW_WAIT seconds (past every
# server's 10 s timeouts), then LEGITIMATE requests start LEGITIMATE_GAP apart, each on a new
# connection given LEGITIMATE_TIMEOUT to bring a status line.
SLOW = 300
SLOW_WAIT = 15.0
LEGITIMATE = 10
LEGITIMATE_GAP = 0.5
LEGITIMATE_TIMEOUT = 5.0
LEGITIMATE_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
ANSWERED = (b"HTTP/1.1 200", b"HTTP/1.1 404")  # whatever the application answers /healthz
# (key, heading, what each slow connection sends first; then b"X" a second)
SLOW_KINDS = (
    ("slow_heads", f"answered, {SLOW} slow heads", b"GET /healthz HTTP/1.1\r\n"),
    (
        "slow_bodies",
        f"answered, {SLOW} slow bodies",
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
    ),
)


# Reconnecting slow clients (bench/reconnect.py): RECONNECTING connections, each sending one of
# the SLOW_KINDS' openings and nothing more, reopened as soon as the server ends one, at most
# RECONNECT_RATE a second, from a process of their own; after RECONNECT_WARM_UP seconds,
# RECONNECT_LEGITIMATE requests start RECONNECT_GAP apart, each given LEGITIMATE_WAIT.
RECONNECTING = 1000
RECONNECT_RATE = 1000.0
RECONNECT_WARM_UP = 2.0
RECONNECT_LEGITIMATE = 20
RECONNECT_GAP = 0.25
LEGITIMATE_WAIT = 10.0
# The figure to reach: every legitimate request answered within this many seconds.
RECONNECT_TARGET = 1.0


def ensure_servers() -> Path:
    """Create bench/.venv-servers with gpuload (editable) and the servers, unless it is there."""
    python = VENV / "bin" / "python"
    if python.exists() and all((VENV / "bin" / name).exists() for name in SCRIPTS):
        return VENV
    print(f"installing {', '.join(PACKAGES)} into {VENV.relative_to(ROOT)} ...", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(VENV / "bin" / "pip"), "install", "--quiet", "-e", str(ROOT), *PACKAGES],
        check=True,
    )
    return VENV


def versions() -> dict[str, str]:
    """Each server's version: gpuload's own for its server."""
    found = {name: peer_version(name, VENV) for name in PACKAGES}
    return {"gpuload": metadata.version("gpuload"), **found}


class Served(ProcessTree):
    """`bench.serve_with` running one server, with the python of bench/.venv-servers."""

    def __init__(self, server: str, scenario: Path) -> None:
        self.name = server
        self.port = free_port()
        self._workdir = Path(tempfile.mkdtemp(prefix=f"bench-server-{server}-"))
        self._cycles = self._workdir / "cycles"
        self._log = self._workdir / "serve.log"
        argv = [
            str(VENV / "bin" / "python"),
            "-m",
            "bench.serve_with",
            server,
            str(self.port),
            str(scenario),
            "--cycles-file",
            str(self._cycles),
        ]
        # Run from the checkout: this checkout's bench and exporter, whatever pip points at.
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        super().__init__(self._process.pid)

    def log_tail(self) -> str:
        """The last lines the server wrote."""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-20:])

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until /metrics serves GPU series."""
        started = time.monotonic()
        url = f"http://127.0.0.1:{self.port}/metrics"
        while time.monotonic() - started < timeout:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if b"\ngpu_" in answer.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def cycles(self) -> int:
        """Collection cycles done so far."""
        return int(self._cycles.read_text() or 0)

    def stop(self) -> None:
        """SIGTERM (gunicorn's master stops its worker), then SIGKILL if it lingers."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs spent on anything but idle and I/O wait since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # Guest time is counted in user time already.
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


def wait_for_quiet(limit: float = QUIET_WAIT) -> float:
    """Wait until the machine is quiet, at most ``limit`` seconds; its last busy CPUs."""
    deadline = time.monotonic() + limit
    while True:
        before, at = machine_busy_seconds(), time.monotonic()
        time.sleep(1.0)
        busy = (machine_busy_seconds() - before) / (time.monotonic() - at)
        if busy < QUIET_CPUS or time.monotonic() >= deadline:
            return busy


def _scrape_for(port: int, seconds: float) -> list[float]:
    """Back-to-back scrapes for ``seconds``; their latencies."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        latencies.append(load.scrape(port, load.PROMETHEUS_HEADERS)[0])
    return latencies


def measure(server: str, scenario: Path = SCENARIO) -> dict[str, float]:
    """Start one server on the simulated node and measure it."""
    served = Served(server, scenario)
    result: dict[str, float] = {}
    try:
        served.wait_ready()
        time.sleep(WARM_UP)
        usage, cycles, machine = served.usage(), served.cycles(), machine_busy_seconds()
        time.sleep(IDLE)
        idle_usage, idle_cycles = served.usage(), served.cycles()
        idle_cpu = idle_usage.cpu_seconds - usage.cpu_seconds
        idle_rate = idle_cpu / (idle_usage.at - usage.at)
        # Whatever else ran on the machine meanwhile, in CPUs: this process only sleeps.
        others = machine_busy_seconds() - machine - idle_cpu
        result["others_cpus"] = max(0.0, others) / (idle_usage.at - usage.at)
        result["idle_cpu_ms_per_cycle"] = _per(idle_cpu * 1000, idle_cycles - cycles)
        alone = load.scrape_latencies(served.port, 1, ALONE)
        result["p99_1"] = load.percentile(alone, 0.99) * 1000
        # Scrapers are processes, as 10 Prometheus servers are (see load.scrape_latencies).
        usage, cycles = served.usage(), served.cycles()
        latencies, _wall = load.in_processes(_scrape_for, [(served.port, WINDOW)] * SCRAPERS)
        after, cycles_after = served.usage(), served.cycles()
        elapsed, cpu = after.at - usage.at, after.cpu_seconds - usage.cpu_seconds
        result["p50_10"] = load.median(latencies) * 1000
        result["p99_10"] = load.percentile(latencies, 0.99) * 1000
        result["scrapes_per_s"] = len(latencies) / elapsed
        # Fewer than one a second: the scrapes held the collection back (for the GIL, the CPUs).
        result["cycles_10"] = cycles_after - cycles
        result["cpu_ms_per_cycle"] = _per(cpu * 1000, cycles_after - cycles)
        # What serving cost over the collecting: the window's CPU less the idle rate's.
        result["cpu_ms_per_scrape"] = _per((cpu - idle_rate * elapsed) * 1000, len(latencies))
        result["rss_mb"] = served.peak_rss_bytes() / 2**20
        result["pss_mb"] = served.pss_bytes() / 2**20
    finally:
        served.stop()
    return result


class Trickle(threading.Thread):
    """``count`` connections that each send ``opening``, then b"X" a second, until stopped.

    One thread, non-blocking connects and sends (as tests/test_http_bounds.py's `Trickle`): a
    connection the server does not take (accept, read) waits without holding the others up.
    What the server sends is read and dropped; ``closed`` counts the connections it ended.
    """

    def __init__(self, port: int, opening: bytes, count: int = SLOW) -> None:
        super().__init__(name="trickle", daemon=True)
        self._address = ("127.0.0.1", port)
        self._opening = opening
        self._count = count
        self._stopping = threading.Event()
        self.closed = 0

    def run(self) -> None:
        """Open the connections, then trickle until stopped; close them."""
        connections: list[socket.socket] = []
        pending: list[bytes] = []  # what of its opening each connection has still to send
        ended: set[int] = set()
        try:
            for _ in range(self._count):
                connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                connection.setblocking(False)
                connection.connect_ex(self._address)  # in progress: sends wait for it
                connections.append(connection)
                pending.append(self._opening)
            while not self._stopping.is_set():
                for index, connection in enumerate(connections):
                    if index not in ended and not self._tick(connection, pending, index):
                        ended.add(index)
                self.closed = len(ended)
                self._stopping.wait(1.0)
        finally:
            for connection in connections:
                connection.close()

    @staticmethod
    def _tick(connection: socket.socket, pending: list[bytes], index: int) -> bool:
        """Send the rest of the opening, or one byte; False once the server has ended it."""
        try:
            if pending[index]:
                pending[index] = pending[index][connection.send(pending[index]) :]
                return True
            with contextlib.suppress(BlockingIOError):  # nothing to read
                if connection.recv(1 << 16) == b"":
                    return False
            connection.send(b"X")
        except BlockingIOError:  # not connected yet, or its send buffer is full
            pass
        except OSError:  # reset, refused
            return False
        return True

    def stop(self) -> None:
        """Stop trickling and close every connection."""
        self._stopping.set()
        self.join()


def answered(port: int) -> bool:
    """Whether one legitimate request on a new connection gets a status line in time."""
    return answered_within(port, LEGITIMATE_TIMEOUT) is not None


def answered_within(port: int, timeout: float) -> float | None:
    """Seconds until one legitimate request on a new connection got its status line, or None."""
    started = time.monotonic()
    deadline = started + timeout
    answer = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(LEGITIMATE_REQUEST)
            while b"\r\n" not in answer:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    except OSError:  # refused, reset or timed out
        return None
    return time.monotonic() - started if answer.startswith(ANSWERED) else None


def measure_slow(server: str, scenario: Path = SCENARIO) -> dict[str, float]:
    """Each kind of slow client against a fresh process of ``server``: requests answered."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result: dict[str, float] = {}
    for key, _, opening in SLOW_KINDS:
        served = Served(server, scenario)
        try:
            served.wait_ready()
            trickle = Trickle(served.port, opening)
            trickle.start()
            try:
                time.sleep(SLOW_WAIT)
                with ThreadPoolExecutor(LEGITIMATE) as pool:
                    futures = []
                    for _ in range(LEGITIMATE):
                        futures.append(pool.submit(answered, served.port))
                        time.sleep(LEGITIMATE_GAP)
                    result[key] = sum(future.result() for future in futures)
                closed = trickle.closed
            finally:
                trickle.stop()
            print(
                f"  {key.replace('_', ' ')}: {result[key]:.0f}/{LEGITIMATE} answered; "
                f"the server had closed {closed} of {SLOW}",
                flush=True,
            )
        finally:
            served.stop()
    for key, _, opening in SLOW_KINDS:
        result.update(_measure_reconnecting(server, scenario, key, opening))
    return result


def _measure_reconnecting(
    server: str, scenario: Path, key: str, opening: bytes
) -> dict[str, float]:
    """Legitimate requests to a fresh ``server`` while slow clients reconnect as closed."""
    served = Served(server, scenario)
    try:
        served.wait_ready()
        attack = Attack(
            ("127.0.0.1", served.port), opening, count=RECONNECTING, rate=RECONNECT_RATE
        )
        attack.start()
        try:
            time.sleep(RECONNECT_WARM_UP)
            with ThreadPoolExecutor(RECONNECT_LEGITIMATE) as pool:
                futures = []
                for _ in range(RECONNECT_LEGITIMATE):
                    futures.append(pool.submit(answered_within, served.port, LEGITIMATE_WAIT))
                    time.sleep(RECONNECT_GAP)
                waits = [future.result() for future in futures]
            attack.stop()
        finally:
            attack.kill()
    finally:
        served.stop()
    answered_waits = [wait for wait in waits if wait is not None]
    figures = {
        f"reconnecting_{key}": float(len(answered_waits)),
        f"reconnecting_{key}_worst": max(answered_waits, default=float("nan")),
        f"reconnecting_{key}_rate": attack.rate,
    }
    print(
        f"  reconnecting {key.replace('_', ' ')}: {len(answered_waits)}/{RECONNECT_LEGITIMATE} "
        f"answered, worst {figures[f'reconnecting_{key}_worst']:.2f} s; "
        f"{attack.reconnects} reconnects ({attack.rate:.0f}/s)",
        flush=True,
    )
    return figures


def _per(total: float, count: int) -> float:
    return total / count if count else float("nan")


def table(results: dict[str, list[dict[str, float] | None]], found: dict[str, str]) -> str:
    """One row per server, one figure per round joined by " / " ("failed" for a failed run)."""
    lines = [["server", "version", *(heading for _, heading, _ in COLUMNS)]]
    for server in SERVERS:
        runs = results.get(server)
        if not runs:
            continue
        cells = [
            " / ".join("failed" if run is None else form.format(run[key]) for run in runs)
            for key, _, form in COLUMNS
        ]
        lines.append([server, found[server], *cells])
    return report.markdown(lines)


def slow_table(results: dict[str, dict[str, float] | None]) -> str:
    """One row per server: legitimate requests answered among each kind of slow client."""
    lines = [["server", *(heading for _, heading, _ in SLOW_KINDS)]]
    for server in SERVERS:
        if server not in results:
            continue
        run = results[server]
        cells = [
            "failed" if run is None else f"{run[key]:.0f}/{LEGITIMATE}" for key, _, _ in SLOW_KINDS
        ]
        lines.append([server, *cells])
    return report.markdown(lines)


def reconnect_table(results: dict[str, dict[str, float] | None]) -> str:
    """One row per server: legitimate requests among reconnecting slow clients, worst wait."""
    headings = ["server"]
    for key, _, _ in SLOW_KINDS:
        name = key.replace("_", " ")
        headings += [f"answered, reconnecting {name}", "worst wait s", "reconnects/s"]
    lines = [headings]
    for server in SERVERS:
        if server not in results:
            continue
        run = results[server]
        cells = []
        for key, _, _ in SLOW_KINDS:
            if run is None or f"reconnecting_{key}" not in run:
                cells += ["failed", "", ""]
                continue
            worst = run[f"reconnecting_{key}_worst"]
            cells += [
                f"{run[f'reconnecting_{key}']:.0f}/{RECONNECT_LEGITIMATE}",
                "-" if math.isnan(worst) else f"{worst:.2f}",  # none answered
                f"{run[f'reconnecting_{key}_rate']:.0f}",
            ]
        lines.append([server, *cells])
    return report.markdown(lines)


def main() -> int:
    """Run the rounds, print the table, rewrite its section of bench/RESULTS.md."""
    parser = argparse.ArgumentParser(prog="python -m bench.servers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--servers", nargs="*", choices=SERVERS, help="default: all four")
    parser.add_argument("--no-write", action="store_true", help="do not rewrite RESULTS.md")
    parser.add_argument(
        "--no-slow-clients", action="store_true", help="skip the slow clients' table"
    )
    args = parser.parse_args()
    started = time.monotonic()
    ensure_servers()
    chosen = [server for server in SERVERS if not args.servers or server in args.servers]
    results: dict[str, list[dict[str, float] | None]] = {}
    failures = []
    for round_ in range(args.rounds):
        for server in chosen if round_ % 2 == 0 else reversed(chosen):
            busy = wait_for_quiet()
            print(f"round {round_ + 1}: {server} (machine busy {busy:.2f} CPUs) ...", flush=True)
            try:
                result: dict[str, float] | None = measure(server)
            except RuntimeError as error:  # a server that did not start: the others still run
                print(f"{server} failed: {error}", flush=True)
                failures.append(f"{server} (round {round_ + 1}): {str(error).splitlines()[0]}")
                result = None
            results.setdefault(server, []).append(result)
    slow: dict[str, dict[str, float] | None] = {}
    for server in [] if args.no_slow_clients else chosen:  # a count, not a timing: once
        print(f"slow clients: {server} ...", flush=True)
        try:
            slow[server] = measure_slow(server)
        except RuntimeError as error:
            print(f"{server} failed: {error}", flush=True)
            failures.append(f"{server} (slow clients): {str(error).splitlines()[0]}")
            slow[server] = None
    found = versions()
    flags = " --no-slow-clients" if args.no_slow_clients else ""
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = "\n".join(
        [
            HEADING,
            "",
            f"Generated by `python -m bench.servers --rounds {args.rounds}{flags}` on {now} in "
            f"{time.monotonic() - started:.0f} s. Do not edit: run it again.",
            "",
            # Not report.machine(): nvitop-exporter, which it names, does not run here.
            f"Machine: {report.host()}; gpuload {found['gpuload']}, "
            + ", ".join(f"{name} {found[name]}" for name in PACKAGES)
            + ".",
            "",
            "The same WSGI application (gpuload's /metrics, 16 x H100 simulated, every collector "
            "on, a cycle every second; each snapshot encoded by the first scrape that asks for "
            "it, its answer kept for the next) behind each server, in the process that collects "
            "(gunicorn: its master and 1 `gthread` worker, which collects), one server at a time, "
            "in alternating order: one figure per round. cheroot, waitress and gunicorn with "
            f"{THREADS} threads; gpuload's `exporter.web.server.Server` a thread per connection. "
            f"After {WARM_UP:.0f} s of warm-up: CPU over {IDLE:.0f} s without scrapes "
            f"(`idle`), then {ALONE} back-to-back scrapes from 1 scraper, then {SCRAPERS} "
            f"scrapers (processes) back to back for {WINDOW:.0f} s, each scrape on a new "
            "connection with Prometheus's headers. `CPU ms/cycle 10` is the process tree's CPU "
            "in that window over the cycles in it (`cycles 10`: a cycle a second unless the "
            "scrapes hold it back; the CPU grows with the scrapes served); "
            "`CPU ms/scrape` is that CPU less the idle rate's, over the scrapes. RSS is the "
            "peak (VmHWM) of each process added up, PSS the processes' sum at the end "
            "(bench/README.md). `others' CPUs`: what the rest of the machine used during the "
            "idle window (2 CPUs, shared): a run beside skews that round. Runner: "
            "`bench/serve_with.py`.",
            "",
            table(results, found),
            "",
            *(
                [
                    f"Slow clients, once per server, each kind against a fresh process: {SLOW} "
                    "connections from one client thread send a request head's first line and "
                    "then a header byte a second (`slow heads`), or a whole POST head announcing "
                    "100,000 bytes and then a body byte a second (`slow bodies`). After "
                    f"{SLOW_WAIT:.0f} s (past every server's 10 s timeouts), {LEGITIMATE} "
                    f"requests for /healthz start {LEGITIMATE_GAP} s apart, each on a new "
                    f"connection given {LEGITIMATE_TIMEOUT:.0f} s to bring a status line (200 "
                    "or 404): how many were answered.",
                    "",
                    slow_table(slow),
                    "",
                    f"Reconnecting slow clients, once per server and kind, each against a fresh "
                    f"process: {RECONNECTING} connections (more than any server here holds, with "
                    "its listen backlog) from a process of their own send the same openings and "
                    "nothing more, and each one the server ends (closed to make room, or at its "
                    f"deadline) is opened again at once, up to {RECONNECT_RATE:.0f} a second "
                    f"(`reconnects/s`: what it reached). After {RECONNECT_WARM_UP:.0f} s, "
                    f"{RECONNECT_LEGITIMATE} requests for /healthz start {RECONNECT_GAP} s apart, "
                    f"each on a new connection given {LEGITIMATE_WAIT:.0f} s: how many got a "
                    "status line, and the longest any waited for it (the target: every one "
                    f"within {RECONNECT_TARGET:.0f} s).",
                    "",
                    reconnect_table(slow),
                    "",
                ]
                if slow
                else []
            ),
            *([f"Failed: {'; '.join(failures)}.", ""] if failures else []),
        ]
    )
    print(text)
    if not args.no_write:
        report.write_section(HEADING, text)
        print(f"wrote {report.RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
