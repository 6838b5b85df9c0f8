"""A client of the kubelet's PodResources API (v1): which devices each container holds.

The kubelet serves it over gRPC on a unix socket, by default
``/var/lib/kubelet/pod-resources/kubelet.sock``. ``List`` answers every pod on the node
with the devices that device plugins allocated to each of its containers: for the NVIDIA
device plugin, resource ``nvidia.com/gpu`` (or ``nvidia.com/mig-1g.10gb`` ...) and device
ids that are GPU or MIG UUIDs. Where the kubelet's ``KubeletPodResourcesDynamicResources``
feature gate is on (beta, on by default, from Kubernetes 1.34), each container also lists the
devices of its Dynamic Resource Allocation claims (``dynamic_resources``): the claim, and per
device the DRA driver's name, its pool and the device's name in the driver's ResourceSlice.

Calls are started without blocking (`PodResourcesClient.start_list`) so that a kubelet
that does not answer never holds up a collection cycle; gRPC's deadline ends them.
"""

from __future__ import annotations

import grpc

from exporter.kubernetes import DEFAULT_SOCKET, Allocation, PodResourcesError
from exporter.kubernetes import podresources_v1_pb2 as api

# The service's full method names: the kubelet's proto package is `v1`.
_LIST = "/v1.PodResourcesLister/List"
# The kubelet's own client allows answers of up to 16 MiB (gRPC's default is 4 MiB);
# a node with many pods and CPU/memory assignments can exceed the default.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PendingList:
    """A `List` call in flight; poll `done()`, then read `result()`."""

    def __init__(self, call: grpc.Future) -> None:
        self._call = call

    def done(self) -> bool:
        """True once the kubelet answered, the call failed or its deadline passed."""
        return bool(self._call.done())

    def result(self) -> list[Allocation]:
        """The allocations; only once `done()`.

        Raises:
            PodResourcesError: the call failed or timed out.
        """
        try:
            response = self._call.result(timeout=0)
        except grpc.RpcError as error:
            raise _error(error) from None
        except grpc.FutureTimeoutError:
            raise PodResourcesError("PENDING", "the call has not finished") from None
        return allocations(response)

    def cancel(self) -> None:
        """Abandon the call."""
        self._call.cancel()


class PodResourcesClient:
    """A gRPC channel to the kubelet's pod-resources socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout: float = 2.0) -> None:
        self.socket_path = socket_path
        self._timeout = timeout
        self._channel = grpc.insecure_channel(
            f"unix:{socket_path}",
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
        )
        self._list = self._channel.unary_unary(
            _LIST,
            request_serializer=api.ListPodResourcesRequest.SerializeToString,
            response_deserializer=api.ListPodResourcesResponse.FromString,
        )

    def start_list(self) -> PendingList:
        """Start a `List` call and return at once; it ends within the client's timeout."""
        return PendingList(self._list.future(api.ListPodResourcesRequest(), timeout=self._timeout))

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._channel.close()


def allocations(response: api.ListPodResourcesResponse) -> list[Allocation]:
    """Flatten a `List` answer into one `Allocation` per container and device.

    A device plugin's device gives its resource name and device id; a DRA claim's device gives
    its driver's name, its device name and the claim.
    """
    found = [
        Allocation(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    ]
    found += [
        Allocation(
            pod.namespace,
            pod.name,
            container.name,
            device.driver_name,
            device.device_name,
            f"{claim.claim_namespace}/{claim.claim_name}",
        )
        for pod in response.pod_resources
        for container in pod.containers
        for claim in container.dynamic_resources
        for device in claim.claim_resources
    ]
    return found


def _error(error: grpc.RpcError) -> PodResourcesError:
    # A failed call is also a grpc.Call with the status code and details.
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return PodResourcesError(code.name if code is not None else "UNKNOWN", details or "")
