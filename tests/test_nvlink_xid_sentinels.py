"""Hopper's NVLink CRC field, MIG instance XIDs kept from unprivileged callers, signed fields.

Each behaviour is cited where the simulator shows it (`exporter/sim/nvlink.py`,
`exporter/sim/events.py`, `exporter/sim/privileges.py`, `_tlimit` in `exporter/sim/functions.py`);
the tests drive it through the real pynvml on the simulated library, and through the collectors.
"""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pynvml
import pytest
from helpers import Clock, exposition_text, parse_metrics, series, value_of

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.nvml import Device
from exporter.snapshot import Snapshot

CRC = "gpu_nvlink_link_crc_errors_total"

# An H100 and an A100 whose links see the same CRC error rates: 3600 flit and 1800 data per hour
# make exact counts over whole minutes.
NVLINK_SCENARIO = """
name: nvlink-crc
driver: {version: "550.90.07", cuda_version: 12040}
loop: false
gpus:
  - model: h100-sxm
    nvlink_errors_per_hour: {replay: 60, crc_flit: 3600, crc_data: 1800}
  - model: a100-sxm4-80gb
    nvlink_errors_per_hour: {replay: 60, crc_flit: 3600, crc_data: 1800}
phases:
  - {duration: 1h, utilization: 0.5}
"""

# GPU 0 in MIG mode, GPU 1 whole: an application's XID (13) on each, and a double-bit ECC XID
# (48), which affects the whole GPU, on the MIG one.
MIG_XID_SCENARIO = """
name: mig-xid
caller: {caller}
driver: {{version: "550.90.07", cuda_version: 12040}}
loop: false
gpus:
  - model: h100-sxm
    mig:
      - {{profile: 3g.40gb}}
      - {{profile: 2g.20gb}}
  - model: h100-sxm
phases:
  - {{duration: 1h, utilization: 0.5}}
faults:
  - {{kind: xid, gpu: 0, at: 10, code: 13}}
  - {{kind: xid, gpu: 0, at: 20, code: 48}}
  - {{kind: xid, gpu: 1, at: 30, code: 13}}
"""

# One H100 whose field values answer NVML's "unavailable" sentinel from 100 to 200 s.
SENTINEL_SCENARIO = """
name: signed-fields
driver: {{version: "{driver}", cuda_version: 12040}}
loop: false
gpus:
  - model: h100-sxm
phases:
  - {{duration: 1h, utilization: 0.5}}
faults:
  - {{kind: sentinel, call: nvmlDeviceGetFieldValues, at: 100, until: 200}}
"""

_NOT_IN_MIG = 0xFFFFFFFF
_TLIMITS = [
    pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT,
    pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT,
    pynvml.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT,
    pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT,
]


@contextmanager
def _simulated(
    tmp_path: Path, scenario: str, at: float
) -> Iterator[tuple[Clock, sim.SimulatedNvml]]:
    """The scenario installed as pynvml's library, NVML initialised, on a hand-moved clock."""
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(scenario))
    clock = Clock(at)
    simulator = sim.install(path, clock=clock, epoch=0)
    pynvml.nvmlInit()
    try:
        yield clock, simulator
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall()


@contextmanager
def _node(
    tmp_path: Path, scenario: str, at: float
) -> Iterator[tuple[Clock, Collection, sim.SimulatedNvml]]:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(scenario))
    clock = Clock(at)
    simulator = sim.install(path, clock=clock, epoch=0)
    collection = Collection(
        dict.fromkeys(REGISTRY, True),
        timeout=60,
        clock=clock,
        options={"nvlink": {"per_link": True}},
    )
    try:
        yield clock, collection, simulator
    finally:
        collection.close()
        sim.uninstall()


def _scrape(snapshot: Snapshot) -> dict:
    return parse_metrics(exposition_text(snapshot))


def _labels(samples: dict, gpu: str) -> dict[str, str]:
    (uuid,) = [dict(k)["uuid"] for k in series(samples, "gpu_up") if dict(k)["gpu"] == gpu]
    return {"gpu": gpu, "uuid": uuid}


def _grown(first: dict, later: dict, **labels: str) -> float:
    before, after = value_of(first, CRC, **labels), value_of(later, CRC, **labels)
    assert before is not None and after is not None, labels
    return after - before


def _crc_types(samples: dict, gpu: str) -> set[str]:
    return {dict(k)["type"] for k in series(samples, CRC) if dict(k)["gpu"] == gpu}


def _field(handle: object, field_id: int, scope: int = 0) -> tuple[int, int, int]:
    """(nvmlReturn, valueType, value) of one field, the value read as its type says."""
    (value,) = pynvml.nvmlDeviceGetFieldValues(handle, [(field_id, scope)])
    members = {
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    }
    number = getattr(value.value, members.get(value.valueType, "ullVal"))
    return value.nvmlReturn, value.valueType, number


# -- Hopper's NVLink CRC ------------------------------------------------------------------------


def test_hopper_counts_link_crc_errors_in_the_field_not_the_per_link_counters(
    tmp_path: Path,
) -> None:
    with _simulated(tmp_path, NVLINK_SCENARIO, at=600) as (clock, _):
        hopper = pynvml.nvmlDeviceGetHandleByIndex(0)
        ampere = pynvml.nvmlDeviceGetHandleByIndex(1)
        for counter in (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA):
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkErrorCounter(hopper, 0, counter)
        replays = pynvml.nvmlDeviceGetNvLinkErrorCounter(
            hopper, 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY
        )
        status, value_type, before = _field(hopper, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 17)
        flit_before = pynvml.nvmlDeviceGetNvLinkErrorCounter(
            ampere, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
        )
        ampere_field, _, _ = _field(ampere, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC)
        clock.now = 1200
        _, _, after = _field(hopper, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 17)
        flit_after = pynvml.nvmlDeviceGetNvLinkErrorCounter(
            ampere, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
        )
    assert replays >= 10  # the other per-link counters remain
    assert (status, value_type) == (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
    assert after - before == 600 + 300  # flit and data CRC errors of 10 minutes, together
    assert flit_after - flit_before == 600  # Ampere keeps its per-link flit counter
    assert ampere_field == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_hopper_crc_errors_keep_their_family_with_type_all(tmp_path: Path) -> None:
    with _node(tmp_path, NVLINK_SCENARIO, at=600) as (clock, collection, simulator):
        first = _scrape(collection.run_cycle())
        clock.now = 1200
        calls = simulator.calls["nvmlDeviceGetNvLinkErrorCounter"]
        later = _scrape(collection.run_cycle())
        calls = simulator.calls["nvmlDeviceGetNvLinkErrorCounter"] - calls
    hopper, ampere = _labels(later, "0"), _labels(later, "1")
    assert _crc_types(later, "0") == {"all"}
    assert _crc_types(later, "1") == {"flit", "data"}
    assert len([k for k in series(later, CRC) if dict(k)["gpu"] == "0"]) == 18  # one per link
    link = {**hopper, "link": "5", "type": "all"}
    assert _grown(first, later, **link) == 900  # flit and data CRC errors of 10 minutes
    assert _grown(first, later, **ampere, link="5", type="flit") == 600
    # The GPU's total: every link's errors, whatever the architecture counts them as.
    total = "gpu_nvlink_crc_errors_total"
    grown = [value_of(later, total, **g) - value_of(first, total, **g) for g in (hopper, ampere)]
    assert grown == [18 * 900, 12 * 900]
    # Hopper's CRC comes with the other fields: only the A100 asks its 12 links, flit and data.
    assert calls == 12 * 2
    assert value_of(later, "gpuload_collector_success", collector="nvlink") == 1
    assert not [k for (name, k) in later if name == "gpuload_nvml_errors_total"]


def test_blackwell_has_none_of_the_nvlink_error_fields(tmp_path: Path) -> None:
    scenario = NVLINK_SCENARIO.replace(
        "  - model: h100-sxm\n", "  - model: h100-sxm\n    architecture: blackwell\n"
    )
    with _simulated(tmp_path, scenario, at=600):
        blackwell = pynvml.nvmlDeviceGetHandleByIndex(0)
        answers = [
            _field(blackwell, field, 0)[0]
            for field in (
                pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
            )
        ]
        state, _, up = _field(blackwell, pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 0)
    assert answers == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 3
    assert (state, up) == (pynvml.NVML_SUCCESS, pynvml.NVML_FEATURE_ENABLED)


# -- MIG instance XIDs ---------------------------------------------------------------------------


def _events(handles: list[object]) -> list[tuple[int, int, int, int]]:
    """(GPU index, XID, gpuInstanceId, computeInstanceId) of each XID event until none is left."""
    event_set = pynvml.nvmlEventSetCreate()
    for handle in handles:
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    events = []
    try:
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 50)
            except pynvml.NVMLError_Timeout:
                return events
            index = pynvml.nvmlDeviceGetIndex(data.device)
            events.append((index, data.eventData, data.gpuInstanceId, data.computeInstanceId))
    finally:
        pynvml.nvmlEventSetFree(event_set)


@pytest.mark.parametrize("caller", ["root", "unprivileged", "unprivileged-no-host-pid"])
def test_only_a_privileged_caller_receives_the_xids_of_mig_instances(
    tmp_path: Path, caller: str
) -> None:
    with _simulated(tmp_path, MIG_XID_SCENARIO.format(caller=caller), at=60):
        handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in (0, 1)]
        instance = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handles[0], 0)
        gpu_instance = pynvml.nvmlDeviceGetGpuInstanceId(instance)
        compute_instance = pynvml.nvmlDeviceGetComputeInstanceId(instance)
        events = _events(handles)
    whole_gpu = [(0, 48, _NOT_IN_MIG, _NOT_IN_MIG), (1, 13, _NOT_IN_MIG, _NOT_IN_MIG)]
    if caller == "root":
        assert events == [(0, 13, gpu_instance, compute_instance), *whole_gpu]
    else:
        assert events == whole_gpu


def _cycles_until(collection: Collection, condition: Callable[[dict], bool]) -> dict:
    """Run cycles until the XID event thread has delivered what `condition` waits for."""
    deadline = time.monotonic() + 15  # only stops a broken run from waiting forever
    while time.monotonic() < deadline:
        samples = _scrape(collection.run_cycle())
        if condition(samples):
            return samples
        time.sleep(0.05)
    raise AssertionError("the XID events did not arrive")


@pytest.mark.parametrize("caller", ["root", "unprivileged", "unprivileged-no-host-pid"])
def test_the_operator_is_told_when_mig_instance_xids_are_withheld(
    tmp_path: Path, caller: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="exporter.collectors.xid")
    with _node(tmp_path, MIG_XID_SCENARIO.format(caller=caller), at=60) as (_, collection, _):

        def arrived(samples: dict) -> bool:
            # XIDs arrive in time order: with the last one (GPU 1's, at 30 s) all have come.
            gpu = [dict(k) for k in series(samples, "gpu_up") if dict(k)["gpu"] == "1"]
            return bool(gpu) and value_of(samples, "gpu_xid_errors_total", **gpu[0], xid="13") == 1

        _cycles_until(collection, arrived)
        samples = _scrape(collection.run_cycle())
    mig, whole = _labels(samples, "0"), _labels(samples, "1")
    withheld = caller != "root"
    assert value_of(samples, "gpu_xid_errors_total", **mig, xid="48") == 1
    assert value_of(samples, "gpu_xid_errors_total", **mig, xid="13") == (None if withheld else 1)
    assert value_of(samples, "gpuload_xid_instance_events_withheld", **mig) == int(withheld)
    # A GPU not in MIG mode has only whole-GPU events: nothing to withhold, no series.
    assert value_of(samples, "gpuload_xid_instance_events_withheld", **whole) is None
    assert value_of(samples, "gpuload_collector_success", collector="xid") == 1
    logged = [
        r.getMessage() for r in caplog.records if "XID errors of MIG instances" in r.getMessage()
    ]
    assert len(logged) == int(withheld), logged
    assert all("run gpuload as root" in line for line in logged), logged


# -- Signed field values and their sentinel ------------------------------------------------------


def test_signed_field_values_read_as_negative_degrees_and_their_sentinel_as_absent(
    tmp_path: Path,
) -> None:
    with _simulated(tmp_path, SENTINEL_SCENARIO.format(driver="550.90.07"), at=50) as (
        clock,
        simulator,
    ):
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        device = Device(0, handle)
        raw = _field(handle, pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT)
        margins = device.field_values(_TLIMITS)
        clock.now = 150  # the sentinel fault's window
        raw_sentinel = _field(handle, pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT)
        during = device.field_values(_TLIMITS)
    model = simulator.gpus[0].model
    shutdown = model.temp_gpu_max - model.temp_shutdown
    slowdown = model.temp_gpu_max - model.temp_slowdown
    assert shutdown < 0 and slowdown < 0  # past the max operating temperature, as recorded
    assert raw == (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_SIGNED_INT, shutdown)
    assert margins == [shutdown, slowdown, 0, 0]
    # NVML_VALUE_NOT_AVAILABLE is -1 in a signed value: absent, not a temperature of -1 C.
    assert raw_sentinel == (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_SIGNED_INT, -1)
    assert during == [None] * 4


@pytest.mark.parametrize(
    ("driver", "known"),
    [("525.116.04", False), ("525.125.06", True), ("530.41.03", False), ("535.43.02", True)],
)
def test_signed_tlimit_fields_come_with_r535_and_the_late_r525_backport(
    tmp_path: Path, driver: str, known: bool
) -> None:
    with _simulated(tmp_path, SENTINEL_SCENARIO.format(driver=driver), at=50):
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        status, value_type, _ = _field(handle, pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT)
        margins = Device(0, handle).field_values(_TLIMITS)
    if known:
        assert (status, value_type) == (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_SIGNED_INT)
        assert margins[2:] == [0, 0]
    else:
        assert status == pynvml.NVML_ERROR_INVALID_ARGUMENT  # past that branch's NVML_FI_MAX
        assert margins == [None] * 4
