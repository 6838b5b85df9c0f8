"""Kubernetes: which pod each GPU is allocated to, from the kubelet's PodResources API.

`podresources` is the gRPC client (v1 API, over the kubelet's unix socket);
`podresources_v1_pb2` holds the API's messages, generated from the `.proto` beside it
(the command to regenerate them is at the top of that file). The collector that turns
allocations into `gpu_pod_info` is `exporter.collectors.kubernetes`.

The plain types the collector needs before any call (the socket's default path, an
allocation, a failed call) live here, without gRPC: grpc and protobuf cost ~10 MB of
resident memory, so they are imported (with `podresources`) only where the socket exists.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


class PodResourcesError(Exception):
    """A call to the kubelet failed; `code` is gRPC's status name (``UNAVAILABLE`` ...)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code


@dataclass(frozen=True)
class Allocation:
    """One device allocated to one container, by a device plugin or through a DRA claim.

    For a device plugin, ``resource`` is the resource name (``nvidia.com/gpu``) and
    ``device_id`` the plugin's id for the device. For Dynamic Resource Allocation, ``resource``
    is the DRA driver's name (``gpu.nvidia.com``), ``device_id`` the device's name in the
    driver's ResourceSlice (``gpu-0``) and ``claim`` the ResourceClaim, ``namespace/name``.
    """

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    claim: str = ""
