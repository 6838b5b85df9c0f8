"""Kubernetes: which pod each GPU is allocated to, from the kubelet's PodResources API.

`podresources` is the gRPC client (v1 API, over the kubelet's unix socket);
`podresources_v1_pb2` holds the API's messages, generated from the `.proto` beside it
(the command to regenerate them is at the top of that file). The collector that turns
allocations into `gpu_pod_info` is `exporter.collectors.kubernetes`.
"""
