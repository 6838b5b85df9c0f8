"""Which pod and container a process belongs to, from its ``/proc/PID/cgroup``.

The kubelet puts every container in a cgroup under its pod's, and the path names both: the pod by
its UID, the container by its runtime's ID. The path's shape depends on four things, each cited:

- **cgroup v1 or v2.** v1 lists one line per hierarchy, ``ID:controllers:path``; v2 one line,
  ``0::path`` (man 7 cgroups, "/proc/[pid]/cgroup"). Any line that names a pod will do.
- **The kubelet's cgroup driver.** ``cgroupfs`` gives ``/kubepods/burstable/pod<uid>/<id>``;
  ``systemd`` gives ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/``
  with the UID's dashes as underscores, since ``-`` separates a slice's parents
  (kubernetes pkg/kubelet/cm/cgroup_manager_linux.go, ``ToSystemd``/``escapeSystemdCgroupName``).
- **The pod's QoS class.** Guaranteed pods sit directly under ``kubepods``; burstable and
  besteffort ones under a class of their own (pkg/kubelet/cm/qos_container_manager_linux.go).
- **The runtime.** containerd names a container's systemd scope ``cri-containerd-<id>.scope``
  (containerd internal/cri, ``systemdCgroupPrefix``) and its cgroupfs directory ``<id>``; CRI-O
  ``crio-<id>.scope`` and ``crio-<id>`` (cri-o internal/config/cgmgr, ``CrioPrefix``); Docker via
  cri-dockerd ``docker-<id>.scope`` and ``<id>``.

A reader in a private cgroup namespace sees another process's path relative to its own root,
``0::/../../kubepods-besteffort.slice/...`` (Documentation/admin-guide/cgroup-v2.rst,
"Namespace"): the segments are read wherever they sit, so that form needs nothing special.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A pod's segment: cgroupfs "pod<uid>", systemd "kubepods[-<qos>]-pod<uid_with_underscores>.slice".
_POD = re.compile(
    r"^(?:kubepods(?:-(?:burstable|besteffort))?-)?pod"
    r"(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?$"
)
# A container's segment: a runtime's scope or directory, or the bare 64-hex ID of cgroupfs.
_CONTAINER = re.compile(
    r"^(?:(?P<runtime>cri-containerd|crio|docker)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)


class UnknownCgroupShape(ValueError):
    """A path under the kubelet's ``kubepods`` cgroup whose pod or container is not recognised."""


@dataclass(frozen=True)
class PodCgroup:
    """The pod (by UID, with dashes) and the container (by runtime ID) of one process."""

    pod_uid: str
    container_id: str


def pod_of(cgroup_text: str) -> PodCgroup | None:
    """The pod and container that ``/proc/PID/cgroup``'s text names; None outside Kubernetes.

    Raises:
        UnknownCgroupShape: a path under ``kubepods`` in which no pod and container segment is
            recognised (a runtime or driver this module does not know); the caller counts the
            process as unattributed for that cause.
    """
    unknown = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        found = _pod_in(parts[2])
        if found is not None:
            return found
        if "kubepods" in parts[2]:
            unknown = parts[2]
    if unknown is not None:
        raise UnknownCgroupShape(f"no pod and container recognised in cgroup path {unknown!r}")
    return None


def _pod_in(path: str) -> PodCgroup | None:
    uid = None
    for segment in path.split("/"):
        pod = _POD.match(segment)
        if pod is not None:
            uid = pod.group("uid").replace("_", "-")
            continue
        container = _CONTAINER.match(segment)
        if uid is not None and container is not None:
            return PodCgroup(uid, container.group("id"))
    return None


class ProcessUnattributed(Exception):
    """Why one process could not be given a pod; ``cause`` names it, for the self-metric.

    Causes: ``process_exited`` (gone between NVML's list and the look-up), ``proc_unreadable``
    (its ``/proc`` entry refused or failed), ``cgroup_unknown`` (a kubepods path of a shape
    `pod_of` does not recognise).
    """

    def __init__(self, cause: str, details: str) -> None:
        super().__init__(details)
        self.cause = cause


# A cgroup file is a line per hierarchy: a few hundred bytes. More is not a cgroup file.
_MAX_CGROUP_BYTES = 64 * 1024


def process_pod(proc_root: str, pid: int) -> PodCgroup | None:
    """The pod and container of process ``pid``, read from ``<proc_root>/<pid>/cgroup``.

    None for a process outside Kubernetes (a host process such as Xorg).

    Raises:
        ProcessUnattributed: the process is gone, its entry unreadable, or its path unknown.
    """
    path = f"{proc_root}/{pid}/cgroup"
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            text = file.read(_MAX_CGROUP_BYTES)
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessUnattributed("process_exited", f"{path}: the process has exited") from None
    except OSError as error:
        raise ProcessUnattributed("proc_unreadable", f"{path}: {error.strerror or error}") from None
    try:
        return pod_of(text)
    except UnknownCgroupShape as error:
        raise ProcessUnattributed("cgroup_unknown", f"{path}: {error}") from None
