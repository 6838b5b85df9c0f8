"""One exporter running on a simulated node through ``gpuload sim exec``, and what it costs.

The daemon is a real process: its CPU time and memory, with those of the processes it starts,
come from ``/proc``. The simulated NVML inside it counts its C calls;
``bench/site/sitecustomize.py`` writes that counter to a file when the daemon receives SIGUSR1,
so reading it costs the daemon nothing between readings.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SITE = BENCH / "site"
PEERS = BENCH / ".venv-peers"
PEER_PACKAGES = ("nvitop-exporter", "py-spy")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ensure_peers() -> Path:
    """Create bench/.venv-peers with nvitop-exporter and py-spy unless it is there already."""
    exporter = PEERS / "bin" / "nvitop-exporter"
    if exporter.exists() and (PEERS / "bin" / "py-spy").exists():
        return PEERS
    print(f"installing {', '.join(PEER_PACKAGES)} into {PEERS.relative_to(ROOT)} ...", flush=True)
    if not (PEERS / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS)], check=True)
    subprocess.run(
        [str(PEERS / "bin" / "pip"), "install", "--quiet", *PEER_PACKAGES],
        check=True,
    )
    return PEERS


def peer_version(package: str, venv: Path = PEERS) -> str:
    """The installed version of a package in the peers' venv (or in ``venv``)."""
    python = venv / "bin" / "python"
    if not python.exists():
        return "?"
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def gpuload_command(port: int) -> list[str]:
    """Gpuload with every collector on, collecting every second."""
    from exporter.collectors import REGISTRY

    flags = [f"--collector.{name}" for name in sorted(REGISTRY)]
    return [
        sys.executable,
        "-m",
        "exporter",
        "serve",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--collect.interval",
        "1s",
        "--log.level",
        "warning",
        *flags,
    ]


def nvitop_command(port: int) -> list[str]:
    """nvitop-exporter, collecting every second (its default)."""
    return [
        str(PEERS / "bin" / "nvitop-exporter"),
        "--bind-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--interval",
        "1",
    ]


@dataclass
class Usage:
    """CPU seconds used so far and when they were read."""

    cpu_seconds: float
    at: float


@dataclass(frozen=True)
class SimulatorCounters:
    """What the simulated NVML inside a daemon has counted so far."""

    calls: dict[str, int]  # C function name -> calls
    cpu_seconds: float  # CPU time its calls took on the daemon's threads


class ProcessTree:
    """A process and the processes it started, measured from ``/proc``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def processes(self) -> list[int]:
        """The process and the processes it started (gunicorn's worker), by pid."""
        pids, index = [self.pid], 0
        while index < len(pids):
            # Each thread has its own list of the children it started.
            for children in Path(f"/proc/{pids[index]}/task").glob("*/children"):
                pids += [int(child) for child in _read(children).split()]
            index += 1
        return pids

    def usage(self) -> Usage:
        """CPU seconds (user + system, all threads) the processes used so far."""
        ticks = 0
        for pid in self.processes():
            stat = _read(Path(f"/proc/{pid}/stat"))
            fields = stat.rpartition(")")[2].split()
            # Fields 14 and 15 of proc(5), counted after the command name's closing parenthesis.
            ticks += int(fields[11]) + int(fields[12]) if fields else 0
        return Usage(ticks / CLOCK_TICKS, time.monotonic())

    def peak_rss_bytes(self) -> int:
        """The peak resident set sizes (VmHWM) of the processes, added up.

        Pages the processes share (the interpreter, libraries) count once per process here.
        """
        return sum(_status_kib(pid, "VmHWM:") for pid in self.processes()) * 1024

    def pss_bytes(self) -> int:
        """Their proportional set sizes now: shared pages split between the processes."""
        total = 0
        for pid in self.processes():
            for line in _read(Path(f"/proc/{pid}/smaps_rollup")).splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        return total


class Daemon(ProcessTree):
    """An exporter started under ``gpuload sim exec`` on one scenario."""

    def __init__(self, name: str, scenario: Path, command: list[str], port: int) -> None:
        self.name = name
        self.port = port
        self._workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        self._calls_file = self._workdir / "calls.json"
        self._log = self._workdir / "daemon.log"
        env = dict(os.environ)
        # This checkout's package first (not whatever `pip install -e` points at), then the
        # sitecustomize that dumps the call counter.
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), str(SITE), env.get("PYTHONPATH")])
        )
        env["BENCH_NVML_CALLS_FILE"] = str(self._calls_file)
        argv = [
            sys.executable,
            "-m",
            "exporter",
            "sim",
            "exec",
            "--scenario",
            str(scenario),
            "--",
            *command,
        ]
        with open(self._log, "wb") as log:
            self._launcher = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self._workdir
            )
        super().__init__(self._child_pid())

    @property
    def url(self) -> str:
        """The metrics URL."""
        return f"http://127.0.0.1:{self.port}/metrics"

    def _child_pid(self) -> int:
        children = Path(f"/proc/{self._launcher.pid}/task/{self._launcher.pid}/children")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._launcher.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            pids = children.read_text().split() if children.exists() else []
            if pids:
                return int(pids[0])
            time.sleep(0.02)
        raise RuntimeError(f"{self.name}: no daemon process appeared")

    def log_tail(self) -> str:
        """The last lines the daemon wrote."""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-20:])

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until /metrics serves GPU series; return the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self._launcher.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:
                    if b"\ngpu_" in answer.read():
                        return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def simulator_counters(self) -> SimulatorCounters:
        """The simulated NVML's counters, read from the daemon through SIGUSR1."""
        before = self._calls_file.stat().st_mtime_ns if self._calls_file.exists() else 0
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self._calls_file.exists() and self._calls_file.stat().st_mtime_ns != before:
                counters = json.loads(self._calls_file.read_text())
                return SimulatorCounters(counters["calls"], counters["cpu_seconds"])
            time.sleep(0.01)
        raise RuntimeError(f"{self.name} did not write its NVML call counter")

    def stop(self) -> None:
        """SIGTERM (forwarded to the daemon by sim exec), then SIGKILL if it lingers."""
        if self._launcher.poll() is None:
            self._launcher.terminate()
            try:
                self._launcher.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self._launcher.kill()
                self._launcher.wait()


def _read(path: Path) -> str:
    """A /proc file's text; empty if the process has gone meanwhile."""
    try:
        return path.read_text()
    except OSError:
        return ""


def _status_kib(pid: int, field: str) -> int:
    for line in _read(Path(f"/proc/{pid}/status")).splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0
