"""A week of the `pods` scenario as a Prometheus would store it, with its truth, and its rules.

:func:`week` writes the series the accounting rules read, one scrape a minute, as OpenMetrics
text for `promtool tsdb create-blocks-from openmetrics`: the scenario's GPUs, pods, owners and
teams (exporter/sim/scenarios/pods.yaml: each GPU at its utilization's mean, each shared GPU's
processes by their weights, each MIG instance by its SMs), its one-off job stretched to end at the
same share of the week as of the scenario, a 20-minute scrape gap and an exporter restart (every
counter back to 0). :class:`Truth` sums the same minutes: GPU-hours held and used per namespace
and owner, and by no pod, counting only minutes that have a scrape.

:func:`backfill_rules` then records the rules the report reads over the week the way Prometheus
would have (:mod:`tools.backfill`): one level of rules at a time (the rules a level reads are
recorded by the levels before it) against a real Prometheus on the blocks, whose output joins the
data as blocks before the next level.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from exporter.alerting import accounting, thresholds
from exporter.sim.scenario import SCENARIO_DIR
from tools import backfill

MONDAY = 1_795_996_800  # 2026-11-30T00:00:00Z
WEEK = 7 * 86400
STEP = 60
# Samples before and after the week, so the week's first minutes have whole windows.
MARGIN = 30 * 60
GAP = (MONDAY + 2 * 86400 + 3 * 3600, 20 * 60)  # Wednesday 03:00, 20 minutes
RESTART = MONDAY + 4 * 86400 + 9 * 3600  # Friday 09:00
INSTANCE = {"instance": "gpu-node-7:19400", "job": "gpuload", "node": "gpu-node-7"}
KSM = {"instance": "ksm:8080", "job": "kube-state-metrics"}
MODEL = "NVIDIA H100 80GB HBM3"
SMS_PER_SLICE = 16  # an H100's, as the simulator's MIG devices report


@dataclass
class Holding:
    """One container's hold on a GPU or MIG instance: its share and the GPU time it uses."""

    namespace: str
    pod: str
    container: str
    gpu: int
    mig_instance: str
    share: float
    use: float
    until: float
    owner: tuple[str, str]


@dataclass
class Truth:
    """GPU-hours per (namespace, owner_kind, owner_name), and of no pod, over the week's minutes."""

    allocated: dict[tuple[str, str, str], float] = field(default_factory=lambda: defaultdict(float))
    used: dict[tuple[str, str, str], float] = field(default_factory=lambda: defaultdict(float))
    unallocated: float = 0.0
    unallocated_used: float = 0.0
    minutes: int = 0


def _mean(value: Any) -> float:
    return float(value["value"] if isinstance(value, dict) else value or 0.0)


def _slices(profile: str) -> int:
    return int(profile.split("g", 1)[0])


def _owner(pod: dict[str, Any]) -> tuple[str, str]:
    owners = pod.get("owners") or []
    if not owners:
        return ("Pod", pod["name"])
    kind, name = owners[-1].split("/", 1)
    return (kind, name)


def holdings(scenario: dict[str, Any]) -> tuple[list[Holding], dict[int, float]]:
    """Each container's holdings, and what each GPU no pod holds uses (work outside pods)."""
    gpus = scenario["gpus"]
    phases_total = sum(_seconds(p["duration"]) for p in scenario.get("phases", [])) or 600
    pods = scenario["kubernetes"]["pods"]
    shared: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    result: list[Holding] = []
    for pod in pods:
        until = _seconds(pod["until"]) / phases_total if "until" in pod else 1.0
        for container in pod["containers"]:
            common = (pod["namespace"], pod["name"], container["name"])
            for gpu in container.get("gpus", []) + container.get("claim", {}).get("gpus", []):
                use = _use(gpus[gpu])
                result.append(Holding(*common, gpu, "", 1.0, use, until, _owner(pod)))
            for gpu in container.get("shared", []):
                shared[gpu].append((pod, container))
            for mig in container.get("mig", []):
                instances = gpus[mig["gpu"]]["mig"]
                held = next(i for i in instances if i["gpu_instance_id"] == mig["instance"])
                share = _slices(held["profile"]) / sum(_slices(i["profile"]) for i in instances)
                use = share * _mean(held.get("overrides", {}).get("utilization"))
                result.append(
                    Holding(
                        *common, mig["gpu"], str(mig["instance"]), share, use, until, _owner(pod)
                    )
                )
    for gpu, holders in shared.items():
        processes = gpus[gpu]["overrides"]["processes"]
        weights = {p["pid"]: p.get("weight", 1) for p in processes}
        total = sum(weights.values())
        for pod, container in holders:
            weight = sum(weights[pid] for pid in container["pids"])
            use = _use(gpus[gpu]) * weight / total
            result.append(
                Holding(
                    pod["namespace"], pod["name"], container["name"], gpu, "",
                    1 / len(holders), use, 1.0, _owner(pod),
                )
            )  # fmt: skip
    held = {h.gpu for h in result}
    free = {i: _use(g) for i, g in enumerate(gpus) if i not in held}
    return result, free


def _use(gpu: dict[str, Any]) -> float:
    overrides = gpu.get("overrides", {})
    if "utilization" in overrides:
        return _mean(overrides["utilization"])
    phases = gpu.get("phases")
    return _mean(phases[0].get("utilization")) if phases else 0.0


def _seconds(text: str) -> float:
    return float(thresholds.duration_seconds(text))


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items() if v != "") + "}"


def week(path: Path) -> Truth:
    """Write the week's OpenMetrics to ``path``; its truth."""
    scenario = yaml.safe_load((SCENARIO_DIR / "pods.yaml").read_text(encoding="utf-8"))
    held, free = holdings(scenario)
    times = [t for t in range(MONDAY - MARGIN, MONDAY + WEEK + MARGIN, STEP) if not _in_gap(t)]
    ended = {h.pod: MONDAY + h.until * WEEK for h in held}
    truth = Truth()
    for t in times:
        if not MONDAY <= t < MONDAY + WEEK:
            continue
        truth.minutes += 1
        for h in held:
            if t < ended[h.pod]:
                key = (h.namespace, *h.owner)
                truth.allocated[key] += h.share / 60
                truth.used[key] += h.use / 60
        for gpu in range(len(scenario["gpus"])):
            if not any(h.gpu == gpu and t < ended[h.pod] for h in held):
                truth.unallocated += 1 / 60
                truth.unallocated_used += free.get(gpu, 0.0) / 60
    with path.open("w", encoding="utf-8") as out:
        for family, kind, series in _families(scenario, held, free, ended):
            out.write(f"# TYPE {family} {kind}\n")
            for labels, value_at in series:
                name = f"{family}_total" if kind == "counter" else family
                text = _labels(labels)
                if isinstance(value_at, _Counter):
                    for t, total in zip(times, value_at.values(times), strict=True):
                        out.write(f"{name}{text} {total:.3f} {t}\n")
                    continue
                for t in times:
                    value = value_at(t)
                    if value is not None:
                        out.write(f"{name}{text} {value:.12g} {t}\n")
        out.write("# EOF\n")
    return truth


def _in_gap(t: int) -> bool:
    return GAP[0] <= t < GAP[0] + GAP[1]


Series = tuple[dict[str, str], Any]


class _Counter:
    """A counter of seconds at ``rate(t)`` per second, back at 0 at :data:`RESTART`."""

    def __init__(self, rate: Callable[[int], float]) -> None:
        self.rate = rate

    def values(self, times: list[int]) -> Iterator[float]:
        total, last = 0.0, MONDAY - MARGIN
        for t in times:
            if last < RESTART <= t:
                total, last = 0.0, RESTART
            total += sum(self.rate(s) * STEP for s in range(last, t, STEP))
            last = t
            yield total


def _counter(rate: Callable[[int], float]) -> _Counter:
    return _Counter(rate)


def _constant(value: float) -> Callable[[int], float]:
    return lambda t: float(value)


def _until(end: float) -> Callable[[int], float | None]:
    return lambda t: 1.0 if t < end else None


def _families(
    scenario: dict[str, Any], held: list[Holding], free: dict[int, float], ended: dict[str, float]
) -> Iterator[tuple[str, str, list[Series]]]:
    gpus = scenario["gpus"]

    def gpu_labels(i: int) -> dict[str, str]:
        return {**INSTANCE, "gpu": str(i), "uuid": f"GPU-{i:08d}"}

    def alive(pod: str) -> Callable[[int], float | None]:
        return lambda t: 1.0 if t < ended[pod] else None

    def whole_use(i: int) -> Callable[[int], float]:
        mine = [h for h in held if h.gpu == i and not h.mig_instance]
        if not mine:
            return lambda t: free.get(i, 0.0)
        return lambda t: sum(h.use for h in mine if t < ended[h.pod])

    yield "gpuload_last_collection_timestamp_seconds", "gauge", [(dict(INSTANCE), float)]
    yield "gpu_up", "gauge", [(gpu_labels(i), lambda t: 1.0) for i in range(len(gpus))]
    yield (
        "gpu_info",
        "gauge",
        [({**gpu_labels(i), "name": MODEL}, lambda t: 1.0) for i in range(len(gpus))],
    )
    mig = [i for i, g in enumerate(gpus) if g.get("mig")]
    yield (
        "gpu_mig_mode_enabled",
        "gauge",
        [(gpu_labels(i), (lambda t, m=i in mig: float(m))) for i in range(len(gpus))],
    )

    def processes(i: int) -> Callable[[int], float]:
        mine = [h for h in held if h.gpu == i]
        if not mine:
            return lambda t: 1.0 if free.get(i) else 0.0
        return lambda t: float(sum(1 for h in mine if t < ended[h.pod]))

    yield "gpu_processes", "gauge", [(gpu_labels(i), processes(i)) for i in range(len(gpus))]
    yield (
        "gpu_utilization_seconds",
        "counter",
        [(gpu_labels(i), _counter(whole_use(i))) for i in range(len(gpus)) if i not in mig],
    )
    instances = [(i, m) for i in mig for m in gpus[i]["mig"]]
    yield (
        "gpu_mig_multiprocessors",
        "gauge",
        [
            (
                {
                    **gpu_labels(i),
                    "mig_instance": str(m["gpu_instance_id"]),
                    "mig_compute_instance": "0",
                    "mig_profile": m["profile"],
                },
                _constant(_slices(m["profile"]) * SMS_PER_SLICE),
            )
            for i, m in instances
        ],
    )
    yield (
        "gpu_mig_sm_active_seconds",
        "counter",
        [
            (
                {
                    **gpu_labels(i),
                    "mig_instance": str(m["gpu_instance_id"]),
                    "mig_profile": m["profile"],
                },
                _counter(_constant(_mean(m.get("overrides", {}).get("utilization")))),
            )
            for i, m in instances
        ],
    )
    pod_labels = [
        (
            h,
            {
                **gpu_labels(h.gpu),
                "namespace": h.namespace,
                "pod": h.pod,
                "container": h.container,
                "mig_instance": h.mig_instance,
            },
        )
        for h in held
    ]
    yield "gpu_pod_info", "gauge", [(labels, alive(h.pod)) for h, labels in pod_labels]
    shares = [(h, labels) for h, labels in pod_labels if h.share < 1 and not h.mig_instance]
    yield (
        "gpu_pod_utilization_seconds",
        "counter",
        [
            (
                {k: v for k, v in labels.items() if k != "mig_instance"},
                _counter(_constant(h.use)),
            )
            for h, labels in shares
        ],
    )
    yield from _kube_state_metrics(scenario, ended)


def _kube_state_metrics(
    scenario: dict[str, Any], ended: dict[str, float]
) -> Iterator[tuple[str, str, list[Series]]]:
    """kube-state-metrics' series of the scenario's pods, for as long as each pod lives."""
    owners: list[Series] = []
    replicasets: list[Series] = []
    jobs: list[Series] = []
    labels: list[Series] = []
    for pod in scenario["kubernetes"]["pods"]:
        alive = _until(ended.get(pod["name"], math.inf))
        base = {**KSM, "namespace": pod["namespace"], "pod": pod["name"], "uid": pod["name"]}
        chain = [o.split("/", 1) for o in pod.get("owners") or []]
        first = chain[0] if chain else ["<none>", "<none>"]
        owners.append(
            (
                {
                    **base,
                    "owner_kind": first[0],
                    "owner_name": first[1],
                    "owner_is_controller": "true" if chain else "<none>",
                },
                alive,
            )
        )
        if len(chain) > 1:
            family = replicasets if chain[0][0] == "ReplicaSet" else jobs
            key = "replicaset" if chain[0][0] == "ReplicaSet" else "job_name"
            family.append(
                (
                    {
                        **KSM,
                        "namespace": pod["namespace"],
                        key: chain[0][1],
                        "owner_kind": chain[1][0],
                        "owner_name": chain[1][1],
                        "owner_is_controller": "true",
                    },
                    alive,
                )
            )
        team = (pod.get("labels") or {}).get("team")
        if team:
            labels.append(({**base, "label_team": team}, alive))
    yield "kube_pod_owner", "gauge", owners
    yield "kube_replicaset_owner", "gauge", replicasets
    yield "kube_job_owner", "gauge", jobs
    yield "kube_pod_labels", "gauge", labels


def _accounting_names() -> set[str]:
    """The series the report reads; the sums by namespace, owner and team are the dashboard's."""
    return {
        accounting.ALLOCATED,
        accounting.USED,
        accounting.UNALLOCATED,
        accounting.UNALLOCATED_USED,
    }


def backfill_rules(
    data: Path, folder: Path, start_prometheus: Callable[[Path, str], str], stop: Callable[[], None]
) -> None:
    """Record the rules the report reads over the week and its margins, into ``data``."""
    backfill.record(
        backfill.rule_levels(_accounting_names()),
        data,
        folder,
        start_prometheus,
        stop,
        (MONDAY - MARGIN + 600, MONDAY + WEEK + MARGIN - 600, STEP),
    )


def create_blocks(openmetrics: Path, data: Path) -> None:
    """Load OpenMetrics text into a Prometheus data folder as blocks."""
    backfill.create_blocks(openmetrics, data)
