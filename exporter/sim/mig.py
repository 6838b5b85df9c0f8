"""Simulated NVML MIG functions: MIG mode, MIG device handles and their identity.

A GPU entry with a ``mig`` list is in MIG mode for the whole scenario (mode [1, 1]). Each compute
instance of its GPU instances is one MIG device, reachable with nvmlDeviceGetMigDeviceHandleByIndex
in (GPU instance id, compute instance id) order; the compute instances of one GPU instance answer
the same nvmlDeviceGetGpuInstanceId and share its memory (nvml.h: "A MIG device handle is an NVML
abstraction which maps to a MIG compute instance"). As on real GPUs, the parent's whole-GPU
utilization, utilization samples, encoder and decoder utilization and per-process utilization
answer NOT_SUPPORTED in MIG mode;
memory and processes are the instances' (processes carry their GPU and compute instance ids). A
MIG handle reaches only the functions registered with ``mig=True`` (name, UUID, memory, processes,
attributes and the calls below); the others answer NOT_SUPPORTED.
"""

from __future__ import annotations

from typing import Any

from exporter.sim import records
from exporter.sim.functions import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    Call,
    device,
    integer,
    target,
    write_pointer,
)

MAX_MIG_DEVICES = 7

# Streaming multiprocessors per compute slice (A100: 98 of 108 SMs usable in MIG, 14 per slice;
# H100 SXM: 132 SMs, 16 per slice, as nvidia-smi mig -lgip reports).
_SMS_PER_SLICE = {"ampere": 14, "hopper": 16}


@device("nvmlDeviceGetMigMode")
def _mig_mode(call: Call, current: Any, pending: Any) -> int:
    if not call.device.model.mig_capable:
        return NOT_SUPPORTED
    enabled = int(bool(call.device.mig))
    target(current).value = enabled
    target(pending).value = enabled
    return SUCCESS


@device("nvmlDeviceGetMaxMigDeviceCount")
def _max_mig_devices(call: Call, ref: Any) -> int:
    target(ref).value = MAX_MIG_DEVICES if call.device.model.mig_capable else 0
    return SUCCESS


@device("nvmlDeviceIsMigDeviceHandle", mig=True)
def _is_mig_handle(call: Call, ref: Any) -> int:
    target(ref).value = int(call.mig is not None)
    return SUCCESS


@device("nvmlDeviceGetMigDeviceHandleByIndex")
def _mig_handle(call: Call, index: Any, ref: Any) -> int:
    gpu, slot = call.device, integer(index)
    if not gpu.model.mig_capable:
        return NOT_SUPPORTED
    if not 0 <= slot < MAX_MIG_DEVICES:
        return INVALID_ARGUMENT
    if slot >= len(gpu.mig):
        return NOT_FOUND  # a valid index with no MIG device behind it
    return write_pointer(ref, gpu.mig[slot].handle_address)


@device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig=True)
def _parent_handle(call: Call, ref: Any) -> int:
    if call.mig is None:
        return NOT_SUPPORTED
    return write_pointer(ref, call.device.handle_address)


@device("nvmlDeviceGetGpuInstanceId", mig=True)
def _gpu_instance_id(call: Call, ref: Any) -> int:
    if call.mig is None:
        return NOT_SUPPORTED
    target(ref).value = call.mig.gpu_instance_id
    return SUCCESS


@device("nvmlDeviceGetComputeInstanceId", mig=True)
def _compute_instance_id(call: Call, ref: Any) -> int:
    if call.mig is None:
        return NOT_SUPPORTED
    target(ref).value = call.mig.compute_instance_id
    return SUCCESS


@device("nvmlDeviceGetAttributes_v2", mig=True)
def _attributes(call: Call, ref: Any) -> int:
    if call.mig is None:
        return NOT_SUPPORTED  # NVML reports attributes of MIG devices only
    spec = call.mig.spec
    architecture = "hopper" if call.device.model.architecture >= 9 else "ampere"
    attributes = records.DeviceAttributes()  # the driver's layout, whatever the caller declared
    # The compute instance's own SMs; engines and memory are its GPU instance's, shared.
    compute_slices = spec.compute_instance_slices or spec.compute_slices
    attributes.multiprocessorCount = compute_slices * _SMS_PER_SLICE[architecture]
    attributes.sharedCopyEngineCount = max(1, spec.compute_slices)
    decoders, jpegs, ofas = _media_engines(architecture, spec.profile, spec.compute_slices)
    attributes.sharedDecoderCount = decoders
    attributes.sharedEncoderCount = 0
    attributes.sharedJpegCount = jpegs
    attributes.sharedOfaCount = ofas
    attributes.gpuInstanceSliceCount = spec.compute_slices
    attributes.computeInstanceSliceCount = compute_slices
    attributes.memorySizeMB = spec.memory_total // 2**20
    records.write(ref, attributes)
    return SUCCESS


def _media_engines(architecture: str, profile: str, slices: int) -> tuple[int, int, int]:
    """(NVDEC, NVJPG, OFA) of a GPU instance: MIG user guide v580, Tables 6-8.

    Hopper: one NVDEC and one NVJPG per compute slice (the recorded H200's 3g.71gb, 2g.35gb and
    1g.18gb devices share 3, 2 and 1 of each), the OFA only in 7g and +me instances. Ampere:
    NVDECs about every other slice, NVJPG and OFA only in 7g. A +me instance has one of each.
    """
    if profile.endswith("+me"):
        return 1, 1, 1
    if architecture == "hopper":
        return slices, slices, slices // 7
    return slices // 2, slices // 7, slices // 7
