"""The Dockerfile's install steps, run outside Docker (there is no Docker engine here).

The build context is what .dockerignore lets through; the wheel is built from the files the
build stage COPYs, with the build stage's `pip wheel` command; the runtime stage's two `pip
install` steps put the locked dependencies (requirements/image.txt), then the wheel without
dependencies, into a fresh virtual environment, where `pip check` must find nothing missing and
`gpuload --version`, a short `gpuload serve --simulate idle` and the image's HEALTHCHECK command
must work. Differences from the image: this machine's Python instead of python:3.12-slim (the
lock's hashes are those of CPython 3.12's wheels, so on another Python the same pins install
without them; tests/test_image.py checks the hashes), and pip's cache left on (the image drops
it) so that the test stays quick.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import venv
import zipfile
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
_LISTENING = re.compile(r"listening on (http://\S+/)")


def dockerfile_lines() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def stages() -> list[list[str]]:
    """Each stage's instructions, FROM first; the ARGs before the first FROM are left out."""
    found: list[list[str]] = []
    for line in dockerfile_lines():
        if line.startswith("FROM "):
            found.append([])
        if found:
            found[-1].append(line)
    return found


def lock_interpreter() -> tuple[str, bool]:
    """A Python for the runtime environment, and whether it is 3.12, which the lock's hashes fit."""
    if sys.version_info[:2] == (3, 12):
        return sys.executable, True
    other = shutil.which("python3.12")
    if other and subprocess.run([other, "-c", "import venv"], capture_output=True).returncode == 0:
        return other, True
    return sys.executable, False


def ignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes; a folder covers its files."""
    verdict = False
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        body = body.removeprefix("**/")
        candidates = prefixes if "/" in body else [*prefixes, *parts]
        if any(fnmatch.fnmatchcase(candidate, body) for candidate in candidates):
            verdict = not negated
    return verdict


def build_context(destination: Path) -> None:
    """Copy what .dockerignore lets through (of the files git knows or would add)."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for relative in listed:
        if (ROOT / relative).is_file() and not ignored(relative, patterns):
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, target)


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    # Only a bound on a hang: a pip install on a busy machine may take minutes.
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{shlex.join(command)}:\n{result.stdout}\n{result.stderr}"
    return result


def test_dockerignore_lets_through_only_the_packaging_inputs() -> None:
    patterns = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and line[0] != "#"
    ]
    for kept in (
        "pyproject.toml",
        "README.md",
        "requirements/image.txt",
        "exporter/cli.py",
        "exporter/sim/models.yaml",
    ):
        assert not ignored(kept, patterns), kept
    for dropped in (
        "tests/test_cli.py",
        ".venv/bin/python",
        ".git/HEAD",
        "helm/gpuload/values.yaml",
        "exporter/__pycache__/cli.cpython-312.pyc",
    ):
        assert ignored(dropped, patterns), dropped


@pytest.mark.engines
def test_dockerfile_install_steps_give_a_working_gpuload(tmp_path: Path) -> None:
    build, runtime = stages()
    # Both stages start from the same base (tests/test_image.py: pinned by digest).
    assert build[0].split()[1] == runtime[0].split()[1]
    assert any(line.startswith("USER 10001") for line in runtime)
    assert 'ENTRYPOINT ["gpuload"]' in runtime

    # Stage 1: the context, the COPY lines, `pip wheel`.
    context, source, dist = tmp_path / "context", tmp_path / "src", tmp_path / "dist"
    build_context(context)
    source.mkdir()
    for line in build:
        if line.startswith("COPY "):
            *sources, target = line.split()[1:]
            for name in sources:
                # Docker's rule: into a folder when the target ends with "/", else to the target.
                destination = source / target
                if target.endswith("/"):
                    destination = destination / Path(name).name
                destination.parent.mkdir(parents=True, exist_ok=True)
                copy = shutil.copytree if (context / name).is_dir() else shutil.copy2
                copy(context / name, destination)
    (wheel_step,) = [line for line in build if line.startswith("RUN pip wheel")]
    paths = {"/dist": str(dist), ".": str(source)}
    wheel_args = [paths.get(a, a) for a in shlex.split(wheel_step)[1:] if a != "--no-cache-dir"]
    run([sys.executable, "-m", *wheel_args])
    (wheel,) = dist.glob("gpuload-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "exporter/sim/scenarios/idle.yaml" in names
    assert "exporter/kubernetes/podresources_v1_pb2.py" in names
    assert not any(name.startswith(("tests/", "tools/")) for name in names)

    # Stage 2: the locked dependencies in a step of their own, then the wheel without them.
    lock_step, wheel_install = [line for line in runtime if "pip install" in line]
    mount = re.search(r"--mount=type=bind,source=(\S+),target=(\S+)", lock_step)
    assert mount and " -r " + mount.group(2) in lock_step, lock_step
    lock = context / mount.group(1)
    assert lock.is_file(), f"{mount.group(1)} is not in the build context (.dockerignore)"
    install = re.search(r"pip install (.*)", lock_step.split("&&")[0])
    assert install, lock_step
    lock_options = [o for o in install.group(1).split() if o != "--no-cache-dir"]
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(lock_options)
    python, hashes_fit = lock_interpreter()
    environment = tmp_path / "runtime"
    if python == sys.executable:
        venv.EnvBuilder(with_pip=True).create(environment)
    else:
        run([python, "-m", "venv", str(environment)])
    if not hashes_fit:
        # The same pins, without the hashes of CPython 3.12's wheels.
        pins = re.findall(r"(?m)^([A-Za-z0-9._-]+==\S+)", lock.read_text())
        lock = tmp_path / "pins.txt"
        lock.write_text("\n".join(pins) + "\n")
        lock_options.remove("--require-hashes")
    lock_options = [str(lock) if o == mount.group(2) else o for o in lock_options]
    pip = str(environment / "bin" / "pip")
    run([pip, "install", "-q", *lock_options])

    install = re.search(r"pip install (.*?) /dist/\*\.whl", wheel_install)
    assert install, wheel_install
    options = [o for o in install.group(1).split() if o != "--no-cache-dir"]
    assert "--no-deps" in options, "every dependency comes from the lock"
    run([pip, "install", "-q", *options, str(wheel)])
    # The lock holds everything the wheel asks for, in versions it accepts.
    assert "pip check" in wheel_install
    run([str(environment / "bin" / "python"), "-m", "pip", "check"])
    if "pip uninstall -y pip" in wheel_install:
        run([str(environment / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "pip"])

    gpuload = str(environment / "bin" / "gpuload")
    version = run([gpuload, "--version"], cwd=tmp_path).stdout.strip()
    assert version == "gpuload 0.1.0"
    check_serve(gpuload, environment / "bin" / "python", tmp_path)


def check_serve(gpuload: str, python: Path, cwd: Path) -> None:
    process = subprocess.Popen(
        [gpuload, "serve", "--simulate", "idle", "--web.listen-address", "127.0.0.1:0"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url: list[str] = []
    lines: list[str] = []
    seen = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = _LISTENING.search(line)
            if match:
                url.append(match.group(1))
                seen.set()
        seen.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        # Bounds on a hang only: the first start from a fresh environment is the slowest.
        assert seen.wait(60) and url, "gpuload serve did not start:\n" + "".join(lines)
        assert requests.get(url[0] + "healthz", timeout=10).status_code == 200
        deadline = time.monotonic() + 30
        while requests.get(url[0] + "readyz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.1)
        assert "gpu_up{" in requests.get(url[0] + "metrics", timeout=5).text
        # The wheel carries the thresholds and runbooks: local alerts and verdicts are on.
        status = requests.get(url[0] + "api/v1/status", timeout=5).json()
        assert "no thresholds file" not in "".join(lines), "".join(lines)
        assert status["gpus"], status
        # The image's HEALTHCHECK, aimed at this server's port instead of 19400.
        instructions = "\n".join(dockerfile_lines())
        (healthcheck,) = re.findall(r'HEALTHCHECK .*CMD \["python", "-c", "(.*)"\]', instructions)
        port = url[0].rstrip("/").rsplit(":", 1)[1]
        run([str(python), "-c", healthcheck.replace("19400", port)])
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("gpuload serve did not stop on SIGTERM")
