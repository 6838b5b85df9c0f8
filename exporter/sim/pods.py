"""A scenario's ``kubernetes:`` section: the node's pods, what each container holds, and when.

Format (every key is optional unless marked required)::

    kubernetes:
      node: gpu-node-7                 # the node's name; default: the scenario's name
      pods:                            # required
        - name: trainer-7d9f8-x2k4q    # required
          namespace: research          # required
          uid: 6f1c...                 # default: made from the seed
          qos: burstable               # guaranteed | burstable (default) | besteffort
          owners: [ReplicaSet/trainer-7d9f8, Deployment/trainer]   # Kind/name, nearest first
          labels: {team: vision}
          from: 0                      # when the pod starts (seconds or a duration), default 0
          until: 6m                    # when it ends, default never
          containers:                  # required
            - name: main               # required
              id: <64 hex digits>      # the runtime's container ID; default: from the seed
              gpus: [0]                # whole GPUs by index (nvidia.com/gpu)
              mig: [{gpu: 1, instance: 1}]   # MIG devices: GPU index, GPU instance id
              shared: [2]              # time-sliced replicas of a GPU (nvidia.com/gpu, <UUID>::<n>)
              claim: {name: infer-gpu, uid: ..., gpus: [3]}   # a DRA ResourceClaim (or mig: [...])
              pids: [5101, 5102]       # the container's processes (``pid`` of the GPUs' processes)
              cgroup: systemd-v2       # systemd-v2 | cgroupfs-v2 | systemd-v1 | cgroupfs-v1 |
                                       # namespaced: the shape of /proc/PID/cgroup
              runtime: containerd      # containerd | cri-o

A time-sliced GPU's replica number counts the pods sharing it, in the order listed (0, 1, ...),
as NVIDIA's device plugin numbers replicas. While a pod is not running, NVML lists none of the
processes whose PIDs its containers name. Defaults for UIDs and container IDs are made from the
scenario's ``seed`` (not from a seed given at install, which changes the GPUs' UUIDs and PIDs).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

from exporter.sim.model import (
    POD_QOS_CLASSES,
    GpuSpec,
    KubernetesSpec,
    PodClaim,
    PodContainer,
    PodSpec,
)
from exporter.sim.schema import (
    _choice,
    _duration,
    _fail,
    _integer,
    _list,
    _mapping,
    _string,
)

CGROUP_SHAPES = ("systemd-v2", "cgroupfs-v2", "systemd-v1", "cgroupfs-v1", "namespaced")
RUNTIMES = ("containerd", "cri-o")

_POD_KEYS = {"name", "namespace", "uid", "qos", "owners", "labels", "from", "until", "containers"}
_CONTAINER_KEYS = {"name", "id", "gpus", "mig", "shared", "claim", "pids", "cgroup", "runtime"}
_UID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_CONTAINER_ID_RE = re.compile(r"^[0-9a-f]{64}$")
# An owner reference as `Kind/name`: a Kubernetes kind is UpperCamelCase.
_OWNER_RE = re.compile(r"^([A-Z][A-Za-z0-9]*)/(\S+)$")


def made_uid(seed: int, *parts: object) -> str:
    """A UUID-shaped id (as the API server gives objects) made from the seed and ``parts``."""
    key = ":".join(str(part) for part in (seed, *parts)).encode()
    digest = hashlib.blake2b(key, digest_size=16).hexdigest()
    # A random (version 4, RFC 4122 variant) UUID, as the API server makes them.
    variant = "89ab"[int(digest[16], 16) % 4]
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-{variant}{digest[17:20]}-{digest[20:]}"


def _made_container_id(seed: int, *parts: object) -> str:
    key = ":".join(str(part) for part in (seed, "container", *parts)).encode()
    return hashlib.blake2b(key, digest_size=32).hexdigest()


def parse_kubernetes(
    value: object, gpus: tuple[GpuSpec, ...], default_node: str, seed: int
) -> KubernetesSpec:
    """Validate the ``kubernetes`` section against the scenario's GPUs."""
    entry = _mapping(value, "kubernetes", {"node", "pods"}, {"pods"})
    node = _string(entry.get("node", default_node), "kubernetes.node")
    parser = _PodParser(gpus, seed)
    pods = tuple(
        parser.pod(raw, f"kubernetes.pods[{i}]")
        for i, raw in enumerate(_list(entry["pods"], "kubernetes.pods"))
    )
    return KubernetesSpec(node=node, pods=pods)


class _PodParser:
    """Parses pods one by one, keeping what must be unique or counted across them."""

    def __init__(self, gpus: tuple[GpuSpec, ...], seed: int) -> None:
        self._gpus = gpus
        self._seed = seed
        self._pids: dict[int, str] = {}  # PID -> the pod that holds it
        self._names: set[tuple[str, str]] = set()
        self._replicas: dict[int, int] = {}  # GPU index -> pods sharing it so far

    def pod(self, value: object, where: str) -> PodSpec:
        entry = _mapping(value, where, _POD_KEYS, {"name", "namespace", "containers"})
        name = _string(entry["name"], f"{where}.name")
        namespace = _string(entry["namespace"], f"{where}.namespace")
        if (namespace, name) in self._names:
            raise _fail(f"{where}.name", f"pod {namespace}/{name} is listed twice")
        self._names.add((namespace, name))
        start = _duration(entry.get("from", 0), f"{where}.from")
        until = _duration(entry["until"], f"{where}.until") if "until" in entry else math.inf
        if until <= start:
            raise _fail(f"{where}.until", "must be later than 'from'")
        uid = entry.get("uid") or made_uid(self._seed, "pod", namespace, name)
        if not isinstance(uid, str) or not _UID_RE.match(uid):
            raise _fail(f"{where}.uid", "expected a UID like 6f1c2d3e-0000-4000-8000-00000000abcd")
        shared_numbers: dict[int, int] = {}  # this pod's replica of each GPU it shares
        containers = []
        for k, raw in enumerate(_list(entry["containers"], f"{where}.containers")):
            at = f"{where}.containers[{k}]"
            containers.append(self._container(raw, at, (namespace, name), shared_numbers))
        if not containers:
            raise _fail(f"{where}.containers", "expected at least one container")
        return PodSpec(
            name=name,
            namespace=namespace,
            uid=uid,
            qos=_choice(entry.get("qos", "burstable"), f"{where}.qos", POD_QOS_CLASSES),
            owners=_owners(entry.get("owners", []), f"{where}.owners"),
            labels=_labels(entry.get("labels", {}), f"{where}.labels"),
            start=start,
            until=until,
            containers=tuple(containers),
        )

    def _container(
        self, value: object, where: str, pod: tuple[str, str], shared_numbers: dict[int, int]
    ) -> PodContainer:
        entry = _mapping(value, where, _CONTAINER_KEYS, {"name"})
        name = _string(entry["name"], f"{where}.name")
        container_id = entry.get("id") or _made_container_id(self._seed, *pod, name)
        if not isinstance(container_id, str) or not _CONTAINER_ID_RE.match(container_id):
            raise _fail(f"{where}.id", "expected a container ID of 64 hex digits")
        shared = []
        for i, index in enumerate(_list(entry.get("shared", []), f"{where}.shared")):
            index = self._whole_gpu(index, f"{where}.shared[{i}]")
            if index not in shared_numbers:
                shared_numbers[index] = self._replicas.get(index, 0)
                self._replicas[index] = shared_numbers[index] + 1
            shared.append((index, shared_numbers[index]))
        return PodContainer(
            name=name,
            id=container_id,
            gpus=self._gpu_list(entry.get("gpus", []), f"{where}.gpus"),
            mig=self._mig_list(entry.get("mig", []), f"{where}.mig"),
            shared=tuple(shared),
            claim=self._claim(entry["claim"], f"{where}.claim", pod) if "claim" in entry else None,
            pids=self._own_pids(entry.get("pids", []), f"{where}.pids", "/".join(pod)),
            cgroup=_choice(entry.get("cgroup", "systemd-v2"), f"{where}.cgroup", CGROUP_SHAPES),
            runtime=_choice(entry.get("runtime", "containerd"), f"{where}.runtime", RUNTIMES),
        )

    def _claim(self, value: object, where: str, pod: tuple[str, str]) -> PodClaim:
        entry = _mapping(value, where, {"name", "uid", "gpus", "mig"}, {"name"})
        name = _string(entry["name"], f"{where}.name")
        uid = entry.get("uid") or made_uid(self._seed, "claim", pod[0], name)
        if not isinstance(uid, str) or not _UID_RE.match(uid):
            raise _fail(f"{where}.uid", "expected a UID like 6f1c2d3e-0000-4000-8000-00000000abcd")
        claim = PodClaim(
            name=name,
            uid=uid,
            gpus=self._gpu_list(entry.get("gpus", []), f"{where}.gpus"),
            mig=self._mig_list(entry.get("mig", []), f"{where}.mig"),
        )
        if not claim.gpus and not claim.mig:
            raise _fail(where, "expected gpus or mig: the devices the claim was allocated")
        return claim

    def _gpu_list(self, value: object, where: str) -> tuple[int, ...]:
        return tuple(self._whole_gpu(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where)))

    def _whole_gpu(self, value: object, where: str) -> int:
        index = _integer(value, where, 0, len(self._gpus) - 1)
        if self._gpus[index].mig:
            raise _fail(where, f"GPU {index} is in MIG mode: allocate its instances with mig")
        return index

    def _mig_list(self, value: object, where: str) -> tuple[tuple[int, int], ...]:
        devices = []
        for i, raw in enumerate(_list(value, where)):
            at = f"{where}[{i}]"
            entry = _mapping(raw, at, {"gpu", "instance"}, {"gpu", "instance"})
            index = _integer(entry["gpu"], f"{at}.gpu", 0, len(self._gpus) - 1)
            ids = sorted({m.gpu_instance_id for m in self._gpus[index].mig})
            if not ids:
                raise _fail(f"{at}.gpu", f"GPU {index} is not in MIG mode (no mig list)")
            instance = entry["instance"]
            if not isinstance(instance, int) or isinstance(instance, bool) or instance not in ids:
                raise _fail(
                    f"{at}.instance",
                    f"expected a GPU instance id of GPU {index}: {', '.join(map(str, ids))}",
                )
            devices.append((index, instance))
        return tuple(devices)

    def _own_pids(self, value: object, where: str, pod: str) -> tuple[int, ...]:
        pids = []
        for i, raw in enumerate(_list(value, where)):
            pid = _integer(raw, f"{where}[{i}]", 1, 4_000_000)
            if pid in self._pids:
                raise _fail(f"{where}[{i}]", f"PID {pid} already belongs to pod {self._pids[pid]}")
            self._pids[pid] = pod
            pids.append(pid)
        return tuple(pids)


def _owners(value: object, where: str) -> tuple[tuple[str, str], ...]:
    owners = []
    for i, raw in enumerate(_list(value, where)):
        match = _OWNER_RE.match(raw) if isinstance(raw, str) else None
        if match is None:
            raise _fail(f"{where}[{i}]", "expected Kind/name, e.g. ReplicaSet/trainer-7d9f8")
        owners.append((match.group(1), match.group(2)))
    return tuple(owners)


def _labels(value: object, where: str) -> Mapping[str, str]:
    entry: dict[str, Any] = _mapping(value, where, value.keys() if isinstance(value, dict) else ())
    labels = {}
    for key, raw in entry.items():
        if not isinstance(key, str) or not key:
            raise _fail(where, "expected label names as strings")
        labels[key] = _string(raw, f"{where}.{key}")
    return labels
