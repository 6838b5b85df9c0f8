"""The image, built for real from the Dockerfile and run as the chart runs it.

`scripts/test --image` runs this (marker `image`), installing Debian's podman, buildah, runc and
debootstrap first. It needs root (debootstrap, chroot) and the Debian and Python package indexes.

The shipped base is python:3.12-slim: Debian 13 with CPython 3.12 built into /usr/local, pip
beside it. Where Docker Hub is out of reach it cannot be pulled, so the test makes a stand-in with
debootstrap, from the same Debian release, and says what differs:

- Python is Debian's python3 (3.13), not python.org's 3.12: the lock has wheels for both
  (scripts/lock-image, PYTHON_VERSIONS), and the test checks the image's Python is one of them;
- pip is installed into /usr/local from Debian's pip wheel, as the official image has it there
  (so that the Dockerfile's `pip uninstall -y pip` works), and Debian's EXTERNALLY-MANAGED marker
  is removed, as the official image has none;
- `python` is a link to python3 (the HEALTHCHECK runs `python`);
- the building machine's CA bundle is copied in, and /etc/pip.conf points pip at it, for package
  indexes behind a proxy that signs with a local CA.

Everything after FROM is the Dockerfile as shipped. buildah builds with `--format docker`, so the
HEALTHCHECK is kept (the OCI format has none), and with runc (crun fails on some cgroup setups).
The exporter then runs the chart's rendered arguments and configuration under the chart's
security context, and the relay `--help` under the relay's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import runpy
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from helpers import ROOT
from test_helm_chart import CHART, FULL_RELAY, render_objects

pytestmark = [
    pytest.mark.skipif(
        not all(map(shutil.which, ("podman", "buildah", "debootstrap", "runc")))
        or os.geteuid() != 0,
        reason="needs root, and Debian's podman, buildah, runc, debootstrap: scripts/test --image",
    ),
    pytest.mark.image,
]

_LOCKING = runpy.run_path(str(ROOT / "scripts" / "lock-image"), run_name="lock_image")
PYTHON_VERSIONS: tuple[str, ...] = _LOCKING["PYTHON_VERSIONS"]
RELEASE: str = _LOCKING["DEBIAN_RELEASE"]  # python:3.12-slim's Debian
MIRROR = os.environ.get("GPULOAD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Run inside the debootstrapped tree (chroot): what makes it stand in for python:3.12-slim.
STAND_IN = (
    "rm -f /usr/lib/python3*/EXTERNALLY-MANAGED",
    "ln -sf python3 /usr/bin/python",
    "set -- /usr/share/python-wheels/pip-*.whl"
    ' && python3 "$1/pip" install --quiet --no-index --root-user-action=ignore "$1"',
    "printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n' > /etc/pip.conf",
)
PACKAGES = "python3,python3-pip-whl,ca-certificates"
# This machine's limits are too high for runc to set in a container: give the common ones.
LIMITS = ("--ulimit", "nofile=1024:4096", "--ulimit", "nproc=4096:4096")


def podman(*args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"podman {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def stand_in_base(folder: Path) -> str:
    """The Debian stand-in for python:3.12-slim, made once per recipe and kept in podman."""
    recipe = json.dumps([RELEASE, MIRROR, PACKAGES, STAND_IN])
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    tag = f"localhost/gpuload-test-base:{RELEASE}-{digest}"
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode == 0:
        return tag
    tree = folder / "rootfs"
    subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", RELEASE, str(tree), MIRROR],
        capture_output=True,
        check=True,
        timeout=1800,
    )
    bundle = "etc/ssl/certs/ca-certificates.crt"
    shutil.copyfile(f"/{bundle}", tree / bundle)
    for step in STAND_IN:
        subprocess.run(["chroot", str(tree), "sh", "-c", step], check=True, timeout=300)
    tar = subprocess.Popen(["tar", "-C", str(tree), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", "-q", "-", tag], stdin=tar.stdout, check=True, timeout=600)
    assert tar.wait() == 0
    shutil.rmtree(tree)
    return tag


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("image")
    base = stand_in_base(folder)
    tag = f"localhost/gpuload:test-{os.getpid()}"
    command = [
        "buildah", "bud", "--format", "docker", "--runtime", "runc", *LIMITS,
        "--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", "VERSION=0.0.0-test",
        "-t", tag, str(ROOT),
    ]  # fmt: skip
    build = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-6000:] + build.stderr[-3000:]
    yield tag
    subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, check=False)


def security_flags(context: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """The podman flags for a Kubernetes container securityContext (the fields the chart sets)."""
    merged = {**pod, **context}
    assert merged["readOnlyRootFilesystem"] is True
    assert merged["allowPrivilegeEscalation"] is False
    assert merged["capabilities"] == {"drop": ["ALL"]}
    flags = ["--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges"]
    user = merged["runAsUser"]
    flags += ["--user", f"{user}:{merged.get('runAsGroup', user)}"]
    if merged.get("runAsNonRoot"):
        assert user != 0
    return flags


def workload(objects: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod spec of the workload with a container `name`, and that container."""
    for found in objects:
        spec = found.get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []):
            if container["name"] == name:
                return spec, container
    raise AssertionError(f"the chart renders no container {name!r}")


def chart(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as loaded:
        return render_objects(loaded, values)


def config_files(objects: list[dict[str, Any]], spec: dict, container: dict, to: Path) -> list[str]:
    """The container's ConfigMap mounts written under `to`: podman --volume flags."""
    flags = []
    for mount in container.get("volumeMounts", []):
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        if "configMap" not in volume:
            continue
        (config_map,) = [
            o
            for o in objects
            if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]
        ]
        folder = to / mount["name"]
        folder.mkdir()
        for key, text in config_map["data"].items():
            (folder / key).write_text(text)
        flags += ["--volume", f"{folder}:{mount['mountPath']}:ro"]
    return flags


def exec_python(container: str, code: str) -> str:
    return podman("exec", container, "python", "-c", code)


def test_the_image_runs_the_charts_exporter_under_its_security_context(
    image: str, tmp_path: Path
) -> None:
    objects = chart({})
    spec, exporter = workload(objects, "exporter")
    flags = security_flags(exporter["securityContext"], spec.get("securityContext", {}))
    flags += config_files(objects, spec, exporter, tmp_path)
    # The chart's arguments as rendered; no GPU here, so the simulated NVML, by environment.
    command = [*exporter.get("command", []), *exporter["args"]]
    container = podman(
        "run", "-d", "--runtime", "runc", "--network", "none", *LIMITS, *flags,
        "--env", "GPULOAD_SIMULATE_SCENARIO=training", image, *command,
    ).strip()  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        metrics = ""
        while time.monotonic() < deadline and "\ngpu_up{" not in metrics:
            time.sleep(1)
            state = podman("inspect", "--format", "{{.State.Status}}", container).strip()
            assert state == "running", podman("logs", container)
            probe = subprocess.run(
                ["podman", "exec", container, "python", "-c",
                 "import urllib.request as u;"
                 "print(u.urlopen('http://127.0.0.1:19400/metrics').read().decode())"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            metrics = probe.stdout
        assert "\ngpu_up{" in metrics, podman("logs", container)
        # The image's own HEALTHCHECK (kept by --format docker), as Docker would run it.
        podman("healthcheck", "run", container)
        # The Python the lock was made for.
        version = exec_python(container, "import sys; print('%d.%d' % sys.version_info[:2])")
        assert version.strip() in PYTHON_VERSIONS
        # Nothing installs packages at run time: pip is gone.
        assert "No module named pip" in subprocess.run(
            ["podman", "exec", container, "python", "-m", "pip", "--version"],
            capture_output=True, text=True, check=False,
        ).stderr  # fmt: skip
    finally:
        subprocess.run(["podman", "rm", "-f", container], capture_output=True, check=False)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image))
    print(f"image size: {size / 1e6:.0f} MB (Debian stand-in base)")


def test_the_image_runs_the_relay_under_its_security_context(image: str) -> None:
    objects = chart(FULL_RELAY)
    spec, relay = workload(objects, "relay")
    flags = security_flags(relay["securityContext"], spec.get("securityContext", {}))
    out = podman(
        "run", "--rm", "--runtime", "runc", "--network", "none", *LIMITS, *flags,
        image, "relay", "--help",
    )  # fmt: skip
    assert re.search(r"usage: gpuload relay", out), out


def test_the_image_labels_say_what_it_is(image: str) -> None:
    config = yaml.safe_load(podman("image", "inspect", "--format", "{{json .Config}}", image))
    assert config["User"] == "10001:10001"
    assert config["Labels"]["org.opencontainers.image.version"] == "0.0.0-test"
    assert config["Entrypoint"] == ["gpuload"]
