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

nvmlDeviceGetGpuInstanceById hands out a GPU instance handle, which nvmlGpuInstanceGetInfo reads:
the instance's id, its profile id (as ``nvidia-smi mig -lgip`` lists it, exporter.sim.model
MIG_PROFILES) and its placement (`exporter.sim.scenario.mig_placement_starts`); the returns are
nvml.h's (go-nvml pkg/nvml/nvml.h :13062-13100).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exporter.sim import records
from exporter.sim.device import HANDLE_BASE, HANDLE_STRIDE
from exporter.sim.functions import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    NOT_SUPPORTED,
    SUCCESS,
    Call,
    address,
    device,
    integer,
    target,
    write_pointer,
)
from exporter.sim.model import MIG_PROFILES

if TYPE_CHECKING:
    from exporter.sim.device import MigDevice
    from exporter.sim.library import SimulatedNvml

MAX_MIG_DEVICES = 7
# A GPU instance handle lies in its GPU's handle stride past the MIG device handles: the GPU's
# handle plus this plus the instance id (ids go up to 14), never taken for a device handle.
_GPU_INSTANCE_HANDLE = 0x80

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


@device("nvmlDeviceGetGpuInstanceById")
def _gpu_instance_by_id(call: Call, instance_id: Any, ref: Any) -> int:
    gpu, wanted = call.device, integer(instance_id)
    if not gpu.mig:
        return NOT_SUPPORTED  # nvml.h: "If device doesn't have MIG mode enabled"
    if not any(m.gpu_instance_id == wanted for m in gpu.mig):
        return NOT_FOUND
    return write_pointer(ref, gpu.handle_address + _GPU_INSTANCE_HANDLE + wanted)


def _locate_gpu_instance(sim: SimulatedNvml, args: tuple[Any, ...]) -> MigDevice | int:
    """The first MIG device of the GPU instance a handle names, so that its GPU's faults apply."""
    offset = address(args[0]) - HANDLE_BASE
    index, within = offset // HANDLE_STRIDE - 1, offset % HANDLE_STRIDE - _GPU_INSTANCE_HANDLE
    if not 0 <= index < len(sim.gpus) or within < 0:
        return INVALID_ARGUMENT
    instances = sim.gpus[index].mig
    return next((m for m in instances if m.gpu_instance_id == within), INVALID_ARGUMENT)


@device("nvmlGpuInstanceGetInfo", locate=_locate_gpu_instance, mig=True)
def _gpu_instance_info(call: Call, _handle: Any, ref: Any) -> int:
    assert call.mig is not None
    spec = call.mig.spec
    info = records.GpuInstanceInfo()
    info.device = call.device.handle_address
    info.id = spec.gpu_instance_id
    info.profileId = MIG_PROFILES[call.device.model.mig_profiles][spec.profile].profile_id
    info.placement.start = spec.placement_start
    info.placement.size = spec.memory_slices
    records.write(ref, info)
    return SUCCESS
