"""A process's pod and container from ``/proc/PID/cgroup``: every path shape the kubelet makes.

Each case is a shape a real node shows, with where it comes from: the kubelet's cgroup naming
(kubernetes pkg/kubelet/cm/cgroup_manager_linux.go and qos_container_manager_linux.go), the
runtimes' container cgroups (containerd internal/cri ``cri-containerd``; cri-o
internal/config/cgmgr ``crio``; cri-dockerd ``docker``), the file's format (man 7 cgroups) and
the cgroup namespace's relative paths (the kernel's Documentation/admin-guide/cgroup-v2.rst,
"Namespace").
"""

from __future__ import annotations

import pytest

from exporter.kubernetes.cgroups import PodCgroup, UnknownCgroupShape, pod_of

UID = "1f6b3c2a-9d4e-4f7a-8b1c-2d3e4f5a6b7c"
SYSTEMD_UID = UID.replace("-", "_")  # systemd's slice names escape the dashes
ID = "4a3b" * 16  # a container ID: 64 hex digits

SHAPES = {
    # cgroup v2 (one "0::" line), systemd driver, containerd: burstable, besteffort, guaranteed.
    "v2-systemd-containerd-burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice"
        f"/cri-containerd-{ID}.scope\n"
    ),
    "v2-systemd-containerd-besteffort": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice"
        f"/cri-containerd-{ID}.scope\n"
    ),
    "v2-systemd-containerd-guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{ID}.scope\n"
    ),
    # cgroup v2, systemd driver, CRI-O.
    "v2-systemd-crio-burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice"
        f"/crio-{ID}.scope\n"
    ),
    # cgroup v2, cgroupfs driver: containerd names the directory by the bare ID, CRI-O "crio-ID".
    "v2-cgroupfs-containerd-burstable": f"0::/kubepods/burstable/pod{UID}/{ID}\n",
    "v2-cgroupfs-containerd-guaranteed": f"0::/kubepods/pod{UID}/{ID}\n",
    "v2-cgroupfs-crio-besteffort": f"0::/kubepods/besteffort/pod{UID}/crio-{ID}\n",
    # cgroup v1: a line per hierarchy; any of them names the pod.
    "v1-cgroupfs-containerd": (
        "12:hugetlb:/\n"
        f"11:memory:/kubepods/burstable/pod{UID}/{ID}\n"
        f"10:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n"
        "1:name=systemd:/\n"
    ),
    "v1-systemd-docker": (
        f"9:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}"
        f".slice/docker-{ID}.scope\n"
    ),
    # A reader in a private cgroup namespace sees the path relative to its own root.
    "v2-private-namespace": (
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice"
        f"/cri-containerd-{ID}.scope\n"
    ),
}


@pytest.mark.parametrize("text", SHAPES.values(), ids=SHAPES.keys())
def test_every_shape_names_the_pod_and_the_container(text: str) -> None:
    assert pod_of(text) == PodCgroup(UID, ID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/sshd.service\n",  # a host service
        "0::/user.slice/user-1000.slice/session-3.scope\n",  # a login session
        "0::/\n",  # the root: a process in a container's own cgroup namespace
        "",  # an empty file: the process exited while it was read
    ],
)
def test_a_process_outside_kubernetes_has_no_pod(text: str) -> None:
    assert pod_of(text) is None


@pytest.mark.parametrize(
    "text",
    [
        f"0::/kubepods/burstable/pod{UID}\n",  # the pod's own cgroup: no container
        f"0::/kubepods/burstable/pod{UID}/newruntime-{ID}.scope\n",  # a runtime not known
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podXYZ.slice/x.scope\n",
    ],
)
def test_an_unknown_shape_under_kubepods_is_said_not_guessed(text: str) -> None:
    with pytest.raises(UnknownCgroupShape, match="no pod and container recognised"):
        pod_of(text)
