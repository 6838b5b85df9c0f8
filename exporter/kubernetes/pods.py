"""This node's pods by UID, with their containers by runtime ID: the join from a cgroup to a name.

A process's ``/proc/PID/cgroup`` names its pod by UID and its container by the runtime's ID
(`exporter.kubernetes.cgroups`); the kubelet's PodResources API names pods by namespace and name.
A Kubernetes v1 ``PodList`` holds both: each pod's ``metadata.uid`` beside its name, and each
container's ``status.containerStatuses[].containerID`` (``containerd://<id>``, ``cri-o://<id>``)
beside the container's name.

The list comes from the API server's pods on this node,
``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>&resourceVersion=0``: the field selector
keeps the answer to this node's pods, and ``resourceVersion=0`` lets the API server answer from
its watch cache instead of a quorum read of etcd
(https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions), which is what a
DaemonSet on every node should ask. docs/security.md weighs this source against the CRI runtime's
socket and the kubelet's own ``/pods``. Any URL answering a PodList will do too (the simulated
kubelet serves one).

A call runs in a thread of its own and is read on a later cycle, as the PodResources call is: an
API server that is slow or drips its answer never holds up a collection.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

# In-cluster credentials, as every pod with a service-account token gets them
# (https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/).
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
APISERVER = "apiserver"
# A node runs at most a few hundred pods (the kubelet's maxPods, 110 by default); their list is
# well under this. An answer past it is refused rather than held in memory.
MAX_BODY_BYTES = 16 * 1024 * 1024
_RUNTIME_PREFIXES = ("containerd://", "cri-o://", "docker://")


class PodListError(Exception):
    """A pods list could not be fetched or read; ``cause`` names the kind, for the self-metric.

    Causes: ``pods_slow`` (no whole answer within the timeout), ``pods_unavailable`` (no
    connection, an HTTP error), ``pods_garbage`` (an answer that is not a PodList).
    """

    def __init__(self, cause: str, details: str) -> None:
        super().__init__(details)
        self.cause = cause


@dataclass(frozen=True)
class PodName:
    """A pod's namespace and name, and its containers' names by runtime ID."""

    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)


def parse_pod_list(body: bytes) -> dict[str, PodName]:
    """The pods of a v1 PodList's JSON, by UID.

    Raises:
        PodListError: ``pods_garbage``, naming what was wrong, for anything but a PodList.
    """
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise PodListError("pods_garbage", f"the answer is not JSON ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        raise PodListError("pods_garbage", "the answer is not a PodList: no list under 'items'")
    pods: dict[str, PodName] = {}
    for item in document["items"]:
        pod = _pod(item)
        if pod is not None:
            pods[pod[0]] = pod[1]
    return pods


def _pod(item: object) -> tuple[str, PodName] | None:
    """One item's UID and names; None for an item without them (it cannot be joined)."""
    if not isinstance(item, dict):
        return None
    metadata = item.get("metadata")
    if not isinstance(metadata, dict):
        return None
    uid, namespace, name = (metadata.get(key) for key in ("uid", "namespace", "name"))
    if not all(isinstance(value, str) and value for value in (uid, namespace, name)):
        return None
    status = item.get("status")
    status = status if isinstance(status, dict) else {}
    containers = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        statuses = status.get(key)
        for entry in statuses if isinstance(statuses, list) else ():
            if not isinstance(entry, dict):
                continue
            container_id, container = entry.get("containerID"), entry.get("name")
            if isinstance(container_id, str) and isinstance(container, str):
                containers[_bare_id(container_id)] = container
    return str(uid), PodName(str(namespace), str(name), containers)


def _bare_id(container_id: str) -> str:
    """``containerd://<id>`` -> ``<id>``: cgroup paths carry the bare ID."""
    for prefix in _RUNTIME_PREFIXES:
        if container_id.startswith(prefix):
            return container_id[len(prefix) :]
    return container_id.split("://", 1)[-1]


class PendingPods:
    """A pods-list call in flight in its own thread; poll `done()`, then read `result()`."""

    def __init__(
        self,
        request: urllib.request.Request | PodListError,
        context: ssl.SSLContext | None = None,
        timeout: float = 0.0,
    ) -> None:
        """Start the call; or, given the error that keeps it from starting, be done with it."""
        self._outcome: dict[str, PodName] | PodListError | None = None
        self._finished = threading.Event()
        self._deadline = time.monotonic() + timeout
        if isinstance(request, PodListError):
            self._outcome = request
            self._finished.set()
            return
        thread = threading.Thread(
            target=self._run, args=(request, context, timeout), name="gpuload-pods", daemon=True
        )
        thread.start()

    def done(self) -> bool:
        """True once answered or failed, or once the deadline has passed."""
        return self._finished.is_set() or time.monotonic() > self._deadline

    def result(self) -> dict[str, PodName]:
        """The pods by UID; only once `done()`.

        Raises:
            PodListError: the call failed, timed out or answered something else.
        """
        outcome = self._outcome
        if outcome is None:
            # The thread may still be reading a dripping answer: it is abandoned, and ends at the
            # socket's timeout.
            raise PodListError("pods_slow", "no whole answer within the timeout")
        if isinstance(outcome, PodListError):
            raise outcome
        return outcome

    def _run(
        self, request: urllib.request.Request, context: ssl.SSLContext | None, timeout: float
    ) -> None:
        try:
            self._outcome = parse_pod_list(self._fetch(request, context, timeout))
        except PodListError as error:
            self._outcome = error
        finally:
            self._finished.set()

    def _fetch(
        self, request: urllib.request.Request, context: ssl.SSLContext | None, timeout: float
    ) -> bytes:
        chunks, size = [], 0
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
                while chunk := answer.read(65536):
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise PodListError(
                            "pods_garbage", f"the answer is over {MAX_BODY_BYTES} bytes"
                        )
                    if time.monotonic() > self._deadline:
                        raise PodListError("pods_slow", "no whole answer within the timeout")
                    chunks.append(chunk)
        except TimeoutError:
            raise PodListError("pods_slow", "no whole answer within the timeout") from None
        except OSError as error:  # URLError, HTTPError and connection errors are OSErrors
            raise PodListError("pods_unavailable", str(error)) from None
        return b"".join(chunks)


class PodListSource:
    """Where this node's pods are listed: ``apiserver`` (in-cluster) or a URL of a PodList."""

    def __init__(self, source: str, node: str = "", timeout: float = 2.0) -> None:
        """Raises ValueError, naming what is missing, for a source that cannot work."""
        self._timeout = timeout
        self._in_cluster = source == APISERVER
        if self._in_cluster:
            node = node or os.environ.get("NODE_NAME", "")
            if not node:
                raise ValueError(
                    "collectors.kubernetes.pods: apiserver needs this node's name: set the "
                    "environment variable NODE_NAME (the Helm chart sets it from spec.nodeName) "
                    "or collectors.kubernetes.node"
                )
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError(
                    "collectors.kubernetes.pods: apiserver needs KUBERNETES_SERVICE_HOST, which "
                    "the kubelet sets in every pod: gpuload is not running in a pod"
                )
            host = f"[{host}]" if ":" in host else host
            query = urllib.parse.urlencode(
                {"fieldSelector": f"spec.nodeName={node}", "resourceVersion": "0"}
            )
            self.url = f"https://{host}:{port}/api/v1/pods?{query}"
        elif source.startswith(("http://", "https://")):
            self.url = source
        else:
            raise ValueError(
                f'collectors.kubernetes.pods: {source!r}: expected "apiserver", an http(s):// '
                'URL answering a v1 PodList, or "" (off)'
            )

    def start(self) -> PendingPods:
        """Start a call and return at once; it ends within the source's timeout."""
        headers = {"Accept": "application/json"}
        context = None
        if self._in_cluster:
            try:
                # Read at every call: the kubelet rotates bound service-account tokens.
                with open(f"{SERVICE_ACCOUNT}/token", encoding="utf-8") as file:
                    headers["Authorization"] = f"Bearer {file.read().strip()}"
                context = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt")
            except (OSError, ssl.SSLError) as error:
                return PendingPods(
                    PodListError("pods_unavailable", f"no service-account token: {error}")
                )
        request = urllib.request.Request(self.url, headers=headers)
        return PendingPods(request, context, self._timeout)
