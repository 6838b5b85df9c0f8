"""The live status page (`/`) and its JSON (`/api/v1/status`).

The page an on-call engineer keeps open on a node: its host name (and a SIMULATED banner when the
NVML is the simulator) in the header and the tab's title, a summary of the node (GPUs, lost ones,
alerts firing), then one card per GPU, the worst first.

A card's verdict is the GPU's state as the shipped rules recorded it at the local evaluator's
last evaluation (:mod:`exporter.alerting.states`): its state, the 5-minute mean of how busy it
was that the state was judged on, its bottleneck classes with their 5-minute means and runbooks,
and the alerts pending or firing on the GPU and its MIG instances, all from that one evaluation.
The page judges nothing itself: a card's colour is the verdict's attention (a lost GPU is a
fault, a stale one at least a warning). Until the rules' windows are whole after a start, the
header and every verdict say they are warming up.

Below the verdict, bars show what the GPU reads now (utilization, memory, memory bandwidth,
temperature, power, SM clock; a MIG GPU's instances their memory and SM activity), each labelled
"now"; memory and temperature are coloured against the thresholds their alerts use, the clock
when a throttle reason holds it down, and marked with a symbol as well, never colour alone. The
active clock event reasons and the last XID come as chips.

The page is complete as the server renders it: without JavaScript a meta refresh reloads it. A
small inline script instead fetches the page itself every collection interval and swaps in the
new body, so there is one renderer, on the server. No external assets, no framework: the page
works on an air-gapped node.
"""

from __future__ import annotations

import html
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from exporter import __version__
from exporter.alerting import states
from exporter.alerting.evaluator import Alert
from exporter.alerting.history import Sample, snapshot_samples
from exporter.alerting.local import LocalAlerting
from exporter.alerting.thresholds import Thresholds
from exporter.server.document import Level, severity_level, worst
from exporter.snapshot import GpuStatus, Snapshot

StartResponse = Callable[..., Any]
# Clock event reasons that hold the clocks down; the others (idle, application clocks, sync
# boost, display) are the GPU doing as told.
THROTTLE_REASONS = {
    "sw_thermal": "thermal slowdown (SW)",
    "hw_thermal": "thermal slowdown (HW)",
    "hw_slowdown": "HW slowdown",
    "hw_power_brake": "power brake (HW)",
    "sw_power_cap": "power cap",
}
# The alert that judges each throttle reason over time: its severity is the reason's level now.
REASON_ALERTS = {
    "sw_thermal": "GPUThermalThrottling",
    "hw_thermal": "GPUThermalThrottling",
    "hw_slowdown": "GPUHardwareSlowdown",
    "hw_power_brake": "GPUHardwareSlowdown",
    "sw_power_cap": "GPUPowerCapped",
}
OTHER_REASONS = {
    "gpu_idle": "idle",
    "applications_clocks": "application clocks",
    "sync_boost": "sync boost",
    "display_clocks": "display clocks",
}
# Severity -> (rank for sorting, symbol, word): the symbol and word are the cue besides colour.
SEVERITIES = {
    "fault": (0, "\u2716", "FAULT"),
    "warning": (1, "\u25b2", "WARNING"),
    "unknown": (2, "?", "UNKNOWN"),
    "ok": (3, "\u2714", "OK"),
}
LEVEL_SYMBOLS = {"crit": " \u2716", "warn": " \u25b2", "info": " \u25cf", "ok": ""}
# What every bar shows: the last reading, unlike the verdict's means.
NOW = "(now)"
GIB = 2**30


def _ratio(value: float | None, total: float | None) -> float | None:
    if value is None or not total:
        return None
    return max(0.0, min(1.0, value / total))


def _bar(
    name: str,
    ratio: float | None,
    text: str,
    level: Level = "ok",
    note: str = "",
    mark: float | None = None,
    *,
    missing: str = "n/a",
) -> dict[str, Any]:
    """One bar of a reading now.

    ``level`` (ok, warn, crit) is against its threshold, ``mark`` where that lies; ``missing``
    says why there is no reading.
    """
    name = f"{name} {NOW}"
    if ratio is None:
        return {
            "name": name,
            "ratio": None,
            "text": missing,
            "level": "ok",
            "note": "",
            "mark": None,
        }
    return {"name": name, "ratio": ratio, "text": text, "level": level, "note": note, "mark": mark}


def _by_gpu(samples: list[Sample], name: str, **matchers: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for sample in samples:
        label = dict(sample.labels)
        if sample.name != name or "gpu" not in label or "mig_instance" in label:
            continue
        if all(label.get(k) == v for k, v in matchers.items()):
            found.setdefault(label["gpu"], sample.value)
    return found


def _by_label(samples: list[Sample], name: str, label_name: str) -> dict[str, dict[str, float]]:
    """GPU -> label value -> value, for a whole-GPU family with one more label (reason, xid)."""
    found: dict[str, dict[str, float]] = {}
    for sample in samples:
        label = dict(sample.labels)
        if sample.name == name and "gpu" in label and label_name in label:
            found.setdefault(label["gpu"], {})[label[label_name]] = sample.value
    return found


def _mig(samples: list[Sample], name: str) -> dict[tuple[str, str, str], float]:
    """(GPU, GPU instance, profile) -> value of a per-instance MIG family."""
    return {
        (label["gpu"], label["mig_instance"], label.get("mig_profile", "")): sample.value
        for sample in samples
        if sample.name == name
        for label in (dict(sample.labels),)
        if "gpu" in label and "mig_instance" in label
    }


def _mean_words(window: str) -> str:
    """How a mean over the rules' window is labelled: ``5m`` -> ``5-min mean``."""
    return f"{states.window_words(window)} mean"


def warm_up_words(rules: dict[str, Any]) -> str:
    """What a warming-up verdict waits for, from the document's ``rules``."""
    mean = _mean_words(rules["window"])
    need = states.span_words(rules["warm_up_seconds"])
    seen = states.span_words(rules["seen_seconds"])
    return f"{mean}s need {need} of samples, {seen} so far"


def _percent(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def alert_document(alert: Alert) -> dict[str, Any]:
    """One alert in the document: the rules' view, with its phase and the level it colours with."""
    return {
        **states.alert_json(alert),
        "phase": alert.state,
        "level": severity_level(alert.labels.get("severity", "")),
    }


def _alert_name(alert: Alert) -> str:
    """An alert's name, with the MIG instance it is on."""
    instance = alert.labels.get("mig_instance")
    return alert.name if instance is None else f"{alert.name} (MIG {instance})"


def _verdict(
    verdict: states.Verdict, rules: dict[str, Any], provisional_window: str | None = None
) -> dict[str, Any]:
    """A GPU's recorded verdict in the page's words, with the figures it was judged on.

    With ``provisional_window``, ``verdict`` is the provisional rules' (their windows that long)
    while the rules' own windows fill.
    """
    window = provisional_window or rules["window"]
    mean = f"({_mean_words(window)})"
    busy_text = "busy: no mean recorded"
    if verdict.busy is not None:
        busy_text = f"busy {_percent(verdict.busy)} {mean}"
    findings = [b for b in verdict.bottlenecks if b.finding]
    urgent = [a for a in verdict.alerts if states.needs_a_person(a)]
    runbook = urgent[0].annotations.get("runbook_url", "") if urgent else ""
    if not runbook and findings:
        runbook = findings[0].runbook_url
    evidence = [busy_text] if verdict.busy is not None else []
    evidence += [f"{b.name} {_percent(b.value)} ({b.measure})" for b in findings]
    evidence += [
        f"{_alert_name(a)}: {a.annotations['value']}"
        for a in verdict.alerts
        if a.annotations.get("value")
    ]
    # The first finding where there is one ("Hung", "GPUXidError"), else the state.
    headline = verdict.headline()
    label = headline[:1].upper() + headline[1:]
    summary = verdict.summary()
    # A lost GPU is lost now, and a firing critical alert is a fault now; every other verdict is
    # judged on means that do not cover their window yet.
    provisional = rules["warming_up"] and verdict.state != "lost"
    if provisional and provisional_window is not None:
        label = f"{label} (provisional)"
        waiting = warm_up_words(rules)
        summary = f"{summary} (provisional, on {_mean_words(window)}s: the rules' {waiting})"
    elif provisional and verdict.attention != "fault":
        label = "Warming up"
        waiting = warm_up_words(rules)
        summary = f"{summary} ({waiting})" if states.needs_a_look(verdict.attention) else waiting
    return {
        "state": verdict.state,
        "activity": verdict.state,
        "label": label,
        "summary": summary,
        "busy_5m": verdict.busy,
        "busy_text": busy_text,
        "bottlenecks": [b.to_json() for b in verdict.bottlenecks],
        "attention": verdict.attention,
        "healthy": verdict.healthy,
        "provisional": provisional,
        "runbook_url": runbook,
        "evidence": evidence,
    }


def _no_verdict(why: str) -> dict[str, Any]:
    """The verdict of a GPU when no rules were evaluated: local alerting off, or not yet."""
    return {
        "state": "unknown",
        "activity": "unknown",
        "label": "Unknown",
        "summary": why,
        "busy_5m": None,
        "busy_text": "",
        "bottlenecks": [],
        "attention": "unknown",
        "healthy": False,
        "provisional": False,
        "runbook_url": "",
        "evidence": [],
    }


def _severity(gpu: dict[str, Any]) -> str:
    """How much a GPU needs a person: the verdict's attention, or a lost or stale GPU's."""
    if gpu["collection"] == "lost":
        return "fault"
    attention: str = gpu["verdict"]["attention"]
    if gpu["collection"] == "stale" and attention in ("unknown", "ok"):
        return "warning"
    return attention


# The severities the summary counts alerts by; any other (info, none) counts as info.
SUMMARY_SEVERITIES = ("critical", "warning", "info")


def _summary(document: dict[str, Any]) -> dict[str, Any]:
    """The node's counts: GPUs by collection and severity, alerts by severity and phase.

    ``firing`` and ``pending`` count warnings and criticals only; info alerts, which need no
    person, are counted apart in ``info`` whatever their phase.
    """
    gpus = document["gpus"]
    alerts = [*document["alerts"], *(a for g in gpus for a in g["alerts"])]
    by_severity = {
        severity: {
            phase: sum(
                a["phase"] == phase
                and (a["severity"] if a["severity"] in SUMMARY_SEVERITIES else "info") == severity
                for a in alerts
            )
            for phase in ("firing", "pending")
        }
        for severity in SUMMARY_SEVERITIES
    }
    urgent = ("critical", "warning")
    return {
        "gpus": len(gpus),
        "lost": sum(g["collection"] == "lost" for g in gpus),
        "stale": sum(g["collection"] == "stale" for g in gpus),
        "faults": sum(g["severity"] == "fault" for g in gpus),
        "warnings": sum(g["severity"] == "warning" for g in gpus),
        "firing": sum(by_severity[s]["firing"] for s in urgent),
        "pending": sum(by_severity[s]["pending"] for s in urgent),
        "info": sum(by_severity["info"].values()),
        "by_severity": by_severity,
    }


class StatusPage:
    """The WSGI app behind `/` and `/api/v1/status`."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        telemetry_path: str,
        alerting: LocalAlerting | None,
        refresh_seconds: float,
        *,
        hostname: str | None = None,
        scenario: str | None = None,
    ) -> None:
        self._latest = latest
        self._telemetry_path = telemetry_path
        self._alerting = alerting
        self._refresh = max(1.0, refresh_seconds)
        self._hostname = hostname or socket.gethostname()
        # The scenario of the simulated NVML this node reads (a SIMULATED banner), or None.
        self._scenario = scenario
        self._lock = threading.Lock()
        # Counters of seconds (DRAM bandwidth, a MIG instance's SM activity: their
        # last-interval ratios are not in the default profile): their rate between the two last
        # snapshots this page saw, per series.
        self._counters: dict[str, tuple[float, float]] = {}
        self._rates: dict[str, float] = {}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Serve the page or its JSON."""
        status = self.status()
        if environ.get("PATH_INFO") == "/api/v1/status":
            start_response(
                "200 OK",
                [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
            )
            return [json.dumps(status).encode()]
        start_response(
            "200 OK",
            [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")],
        )
        return [page(status, self._telemetry_path, now=time.time()).encode()]

    def _thresholds(self) -> Thresholds | None:
        return None if self._alerting is None else self._alerting.evaluator.thresholds

    def _verdicts(self, snapshot: Snapshot) -> states.Verdicts | None:
        """The verdicts of the last evaluation, read once: its states and alerts belong together."""
        if self._alerting is None:
            return None
        evaluator = self._alerting.evaluator
        identities = {str(gpu.index): (gpu.name, gpu.uuid) for gpu in snapshot.gpus}
        return states.read(evaluator.evaluated, evaluator.thresholds, identities)

    def _provisional(
        self, snapshot: Snapshot, verdicts: states.Verdicts | None
    ) -> states.Verdicts | None:
        """The provisional rules' verdicts while the rules warm up, once theirs are whole."""
        if verdicts is None or not verdicts.warming_up or self._alerting is None:
            return None
        evaluator = self._alerting.provisional
        if evaluator is None:
            return None
        identities = {str(gpu.index): (gpu.name, gpu.uuid) for gpu in snapshot.gpus}
        found = states.read(evaluator.evaluated, evaluator.thresholds, identities)
        return None if found is None or found.warming_up else found

    def status(self) -> dict[str, Any]:
        """The JSON document of `/api/v1/status`."""
        snapshot = self._latest()
        document: dict[str, Any] = {
            "version": __version__,
            "hostname": self._hostname,
            "simulated": self._scenario,
            "refresh_seconds": self._refresh,
            "nvml": "starting",
            "updated_at": None,
            "rules": None,
            "gpus": [],
            "alerts": [],
        }
        if snapshot is None:
            document["summary"] = _summary(document)
            return document
        document["nvml"] = "up" if snapshot.nvml_up else "down"
        document["updated_at"] = snapshot.completed_at
        verdicts = self._verdicts(snapshot)
        if verdicts is not None:
            document["rules"] = verdicts.to_json()
            document["alerts"] = [alert_document(a) for a in verdicts.node_alerts]
        samples = list(snapshot_samples(snapshot))
        now = snapshot.completed_at
        values = {
            "util": _by_gpu(samples, "gpu_utilization_ratio"),
            "used": _by_gpu(samples, "gpu_memory_used_bytes"),
            "total": _by_gpu(samples, "gpu_memory_total_bytes"),
            "dram": self._counter_rates(now, _by_gpu(samples, "gpu_dram_active_seconds_total")),
            "memutil": _by_gpu(samples, "gpu_memory_utilization_ratio"),
            "temp": _by_gpu(samples, "gpu_temperature_celsius", sensor="gpu"),
            "shutdown": _by_gpu(samples, "gpu_temperature_shutdown_threshold_celsius"),
            "slowdown": _by_gpu(samples, "gpu_temperature_slowdown_threshold_celsius"),
            "power": _by_gpu(samples, "gpu_power_usage_watts"),
            "limit": _by_gpu(samples, "gpu_power_limit_watts"),
            "sm_clock": _by_gpu(samples, "gpu_clock_hertz", clock="sm"),
            "sm_max": _by_gpu(samples, "gpu_clock_max_hertz", clock="sm"),
            "mig_mode": _by_gpu(samples, "gpu_mig_mode_enabled"),
            "last_xid": _by_gpu(samples, "gpu_last_xid_code"),
        }
        labelled = {
            "events": _by_label(samples, "gpu_clock_event_active", "reason"),
            "xids": _by_label(samples, "gpu_xid_errors_total", "xid"),
        }
        mig = self._mig_instances(now, samples)
        # While the rules warm up, the cards' verdicts are the provisional rules' (the alerts
        # stay the rules' own: only those are notified).
        provisional = self._provisional(snapshot, verdicts)
        shown = provisional or verdicts
        window = provisional.window if provisional is not None else None
        words = document["rules"] if window is None else {**document["rules"], "window": window}
        for gpu in snapshot.gpus:
            key = str(gpu.index)
            card = self._gpu(gpu, values, labelled)
            verdict = shown.gpus.get(key) if shown is not None else None
            alerts = verdicts.gpus.get(key) if verdicts is not None else None
            if verdict is not None:
                card["verdict"] = _verdict(verdict, document["rules"], window)
                self._not_idle_while_busy(card["verdict"], values["util"].get(key))
                card["alerts"] = [alert_document(a) for a in alerts.alerts] if alerts else []
            else:
                why = "local alerting is off" if self._alerting is None else "no evaluation yet"
                card["verdict"] = _no_verdict(why)
                card["alerts"] = []
            card["mig"] = _with_means(mig.get(key, []), verdict, words)
            card["severity"] = _severity(card)
            document["gpus"].append(card)
        document["summary"] = _summary(document)
        return document

    def _not_idle_while_busy(self, verdict: dict[str, Any], busy_now: float | None) -> None:
        """Say "unknown", not "idle", while the reading now is at or above the idle threshold.

        The rules call a GPU nobody holds idle on its mean (none yet after a start); a page that
        says "idle" beside a bar busier than the threshold contradicts itself.
        """
        thresholds = self._thresholds()
        if verdict["activity"] != "idle" or busy_now is None or thresholds is None:
            return
        below = thresholds.alert("GPUUtilizationLow").number("below")
        if busy_now < below:
            return
        verdict["state"] = verdict["activity"] = states.UNRECORDED
        if verdict["label"] == "Idle":
            verdict["label"] = "Unknown"
        verdict["summary"] = (
            f"recorded idle, but {_percent(busy_now)} busy now: "
            f"its {_mean_words(thresholds.window)} has yet to follow"
        )

    def _counter_rates(self, now: float, seconds: dict[str, float]) -> dict[str, float]:
        with self._lock:
            for key, total in seconds.items():
                before = self._counters.get(key)
                if before is not None and now > before[0] and total >= before[1]:
                    self._rates[key] = min(1.0, (total - before[1]) / (now - before[0]))
                if before is None or now > before[0]:
                    self._counters[key] = (now, total)
            return {key: self._rates[key] for key in seconds if key in self._rates}

    def _mig_instances(self, now: float, samples: list[Sample]) -> dict[str, list[dict[str, Any]]]:
        """GPU -> its MIG GPU instances, each with memory and SM activity bars."""
        used = _mig(samples, "gpu_mig_memory_used_bytes")
        total = _mig(samples, "gpu_mig_memory_total_bytes")
        active = _mig(samples, "gpu_mig_sm_active_seconds_total")
        sm = self._counter_rates(now, {"mig/" + "/".join(key): v for key, v in active.items()})
        memory_full = self._memory_full()
        found: dict[str, list[dict[str, Any]]] = {}
        for key in sorted({*used, *total, *active}, key=lambda k: (int(k[0]), int(k[1]))):
            gpu, instance, profile = key
            ratio = _ratio(used.get(key), total.get(key))
            full = ratio is not None and memory_full is not None and ratio > memory_full
            level = self._alert_level("GPUMemoryNearlyFull") if full else "ok"
            memory = _bar(
                "Memory",
                ratio,
                f"{(used.get(key) or 0) / GIB:.1f} / {(total.get(key) or 0) / GIB:.1f} GiB",
                level,
                "nearly full" if level != "ok" else "",
                memory_full,
            )
            activity = sm.get("mig/" + "/".join(key))
            # GPM (H100 and newer) counts each instance's SM activity, older GPUs nothing; the
            # rate needs two readings of the counter.
            gpm = key in active
            busy = _bar(
                "SM active",
                activity,
                f"{(activity or 0) * 100:.0f}%",
                missing="needs a second reading" if gpm else "n/a (no GPM)",
            )
            found.setdefault(gpu, []).append(
                {
                    "instance": int(instance),
                    "profile": profile,
                    "gpm": gpm,
                    "bars": [memory, busy],
                }
            )
        return found

    def _alert_level(self, alertname: str) -> Level:
        """The level of a reading past ``alertname``'s threshold: the alert's severity."""
        thresholds = self._thresholds()
        if thresholds is None:
            return "ok"
        return severity_level(thresholds.alert(alertname).severity)

    def _above(self, alertname: str, key: str, value: float | None) -> Level:
        """``alertname``'s level where ``value`` is above its threshold ``key``, else ok."""
        thresholds = self._thresholds()
        if thresholds is None or value is None:
            return "ok"
        return (
            self._alert_level(alertname)
            if value > thresholds.alert(alertname).number(key)
            else "ok"
        )

    def _memory_full(self) -> float | None:
        """GPUMemoryNearlyFull's threshold; None without a thresholds file (no bar is judged)."""
        thresholds = self._thresholds()
        if thresholds is None:
            return None
        return thresholds.alert("GPUMemoryNearlyFull").number("used_above")

    def _gpu(
        self,
        gpu: GpuStatus,
        values: dict[str, dict[str, float]],
        labelled: dict[str, dict[str, dict[str, float]]],
    ) -> dict[str, Any]:
        """A GPU's card without its verdict: identity, readings now, clock events, XIDs."""
        key = str(gpu.index)

        def get(what: str) -> float | None:
            return values[what].get(key)

        used, total = get("used"), get("total")
        bandwidth = get("dram")
        bandwidth_name = "DRAM bandwidth" if bandwidth is not None else "Memory busy"
        # DRAM active is what GPUMemoryBandwidthBound judges; the memory controller's busy share
        # is another measure, judged by no alert.
        bandwidth_level = self._above("GPUMemoryBandwidthBound", "dram_active_above", bandwidth)
        if bandwidth is None:
            bandwidth = get("memutil")
        events = labelled["events"].get(key, {})
        throttles = [r for r in THROTTLE_REASONS if events.get(r)]
        memory_ratio = _ratio(used, total)
        memory_full = self._memory_full()
        memory_level = self._above("GPUMemoryNearlyFull", "used_above", memory_ratio)
        power, limit = get("power"), get("limit")
        util = get("util")
        bars = [
            _bar(
                "Utilization",
                util,
                f"{(util or 0) * 100:.0f}%",
                self._above("GPUUtilizationHigh", "above", util),
            ),
            _bar(
                "Memory",
                memory_ratio,
                f"{(used or 0) / GIB:.1f} / {(total or 0) / GIB:.0f} GiB",
                memory_level,
                "nearly full" if memory_level != "ok" else "",
                memory_full,
            ),
            _bar(bandwidth_name, bandwidth, f"{(bandwidth or 0) * 100:.0f}%", bandwidth_level),
            self._temperature(get("temp"), get("slowdown"), get("shutdown")),
            _bar("Power", _ratio(power, limit), f"{power or 0:.0f} / {limit or 0:.0f} W"),
            _clock_bar(get("sm_clock"), get("sm_max"), throttles, self._throttle_level(throttles)),
        ]
        xids = labelled["xids"].get(key, {})
        last_xid = int(get("last_xid") or 0)
        critical = sorted(set(xids) & self._critical_xids())
        # A critical XID is GPUXidError's; any other has no alert: shown, needing no person.
        xid_level: Level = "ok"
        if critical or (last_xid and str(last_xid) in self._critical_xids()):
            xid_level = self._alert_level("GPUXidError")
        elif last_xid or any(xids.values()):
            xid_level = "info"
        collection = "stale" if gpu.stale else "up" if gpu.up else "lost"
        return {
            "index": gpu.index,
            # A GPU lost before it was read has neither: the page says so rather than nothing.
            "name": gpu.name or states.unidentified("name", not gpu.up),
            "uuid": gpu.uuid or states.unidentified("UUID", not gpu.up),
            "state": collection,
            "collection": collection,
            "bars": bars,
            "clock_events": [
                {
                    "reason": r,
                    "text": THROTTLE_REASONS.get(r) or OTHER_REASONS.get(r, r),
                    "level": self._throttle_level([r] if r in THROTTLE_REASONS else []),
                }
                for r, active in events.items()
                if active
            ],
            "throttled": bool(throttles),
            "last_xid": last_xid,
            "xids": {code: int(count) for code, count in sorted(xids.items()) if count},
            "critical_xids": critical,
            "xid_level": xid_level,
            "mig_mode": bool(get("mig_mode")),
        }

    def _throttle_level(self, throttles: list[str]) -> Level:
        """The level of active throttle reasons: the severity of the alerts that judge them."""
        return worst([self._alert_level(REASON_ALERTS[reason]) for reason in throttles])

    def _critical_xids(self) -> set[str]:
        thresholds = self._thresholds()
        if thresholds is None:
            return set()
        return {str(code) for code in thresholds.alert("GPUXidError").xids()}

    def _temperature(
        self, temp: float | None, slowdown: float | None, shutdown: float | None
    ) -> dict[str, Any]:
        thresholds = self._thresholds()
        ceiling = shutdown or slowdown or 100.0
        if temp is None:
            return _bar("Temperature", None, "")
        level: Level = "ok"
        note = ""
        # "Near" is GPUTemperatureHigh's (no thresholds file: only the GPU's own slowdown).
        near = None
        if thresholds is not None:
            high = thresholds.alert("GPUTemperatureHigh")
            margin, fallback = high.number("margin_celsius"), high.number("fallback_celsius")
            near = slowdown - margin if slowdown is not None else fallback
        # Past GPUTemperatureHigh's threshold the bar takes its level; the note says how far.
        if near is not None and temp >= near:
            level = self._alert_level("GPUTemperatureHigh")
            note = f"near slowdown {slowdown or fallback:.0f} °C"
        if slowdown is not None and temp >= slowdown:
            note = f"at slowdown {slowdown:.0f} °C"
        text = f"{temp:.0f} °C" + (f" / {slowdown:.0f}" if slowdown is not None else "")
        mark = _ratio(slowdown, ceiling) if slowdown is not None else None
        return _bar("Temperature", _ratio(temp, ceiling), text, level, note, mark)


def _clock_bar(
    clock: float | None, maximum: float | None, throttles: list[str], level: Level
) -> dict[str, Any]:
    """SM clock / its maximum; held down when a throttle reason is active, at that ``level``."""
    ratio = _ratio(clock, maximum)
    text = f"{(clock or 0) / 1e6:.0f} / {(maximum or 0) / 1e6:.0f} MHz"
    if not throttles:
        return _bar("SM clock", ratio, text)
    note = "held down: " + ", ".join(THROTTLE_REASONS[r] for r in throttles)
    return _bar("SM clock", ratio, text, level, note)


def _with_means(
    instances: list[dict[str, Any]], verdict: states.Verdict | None, rules: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """A GPU's MIG instances, each with its SM activity's recorded mean and what it says."""
    means = {int(i.instance): i.sm_active for i in verdict.instances} if verdict else {}
    found = []
    for instance in instances:
        mean = means.get(instance["instance"])
        if not instance["gpm"]:
            text = "SM activity n/a (no GPM)"
        elif mean is not None and rules is not None:
            text = f"SM active {_percent(mean)} ({_mean_words(rules['window'])})"
        elif rules is not None and rules["warming_up"]:
            text = "SM activity warming up"
        else:
            text = "SM activity: no mean recorded"
        found.append({**instance, "sm_active_5m": mean, "sm_active_text": text})
    return found


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em 1.5em;background:#f6f7f9;color:#1d2430}
header h1{margin:0;font-size:1.6em}header h1 small{font-size:.55em;font-weight:normal;color:#4a5568}
.meta{margin:.3em 0;color:#4a5568;font-size:.9em}
.sim{margin:0 0 .6em;padding:.4em .8em;font-weight:700;letter-spacing:.04em;color:#1d2430;
background:repeating-linear-gradient(135deg,#faf089 0 14px,#fefcbf 14px 28px);
border:2px dashed #975a16;border-radius:6px}
.nvml-down{margin:.4em 0;padding:.4em .8em;background:#c53030;color:#fff;font-weight:700;
border-radius:6px}
.summary{display:flex;flex-wrap:wrap;gap:.5em;margin:.6em 0;padding:0;list-style:none}
.summary li{background:#fff;border:1px solid #cbd5e0;border-radius:1em;padding:.15em .8em;
font-weight:600}.summary li.zero{color:#718096;font-weight:normal}
.summary li.bad{background:#c53030;border-color:#c53030;color:#fff}
.summary li.warn{background:#c05621;border-color:#c05621;color:#fff}
.summary li.info{background:#ebf4ff;border-color:#2c5282;color:#2c5282}
#gpus{display:grid;grid-template-columns:repeat(auto-fill,minmax(26em,1fr));gap:1em;margin:1em 0}
.card{background:#fff;border-radius:8px;padding:.7em 1em;border-left:8px solid #2f855a;
box-shadow:0 1px 3px rgba(0,0,0,.12)}
.card.sev-warning{border-left-color:#c05621}
.card.sev-unknown{border-left-color:#718096}
.card.sev-fault{border-left-color:#c53030;background:#fff5f5;outline:2px solid #c53030}
.card h2{font-size:1.05em;margin:0;display:flex;gap:.5em;align-items:baseline;flex-wrap:wrap}
.card h2 small{font-weight:normal;color:#4a5568}
.badge{font-size:.75em;padding:.1em .5em;border-radius:4px;color:#fff;background:#2f855a}
.sev-warning .badge{background:#c05621}.sev-fault .badge{background:#c53030}
.sev-unknown .badge{background:#718096}
.uuid{font-family:monospace;font-size:.75em;color:#718096;margin:.2em 0 .4em}
.verdict{margin:.3em 0}.warming{margin:.3em 0;color:#975a16;font-weight:600}
.mean{margin:0 0 .2em 11.8em;font-size:.8em;color:#4a5568}
.evidence{margin:.1em 0 .4em;padding-left:1.2em;font-size:.85em}
.bar{display:grid;grid-template-columns:10.6em 1fr 9em;align-items:center;gap:.5em;
font-size:.85em;margin:.3em 0}
.track{position:relative;background:#e2e8f0;border-radius:3px;height:.9em}
.fill{background:#3182ce;height:100%;border-radius:3px}
.warn .fill{background:#dd6b20}.info .fill{background:#2c5282}
.crit .fill{background:repeating-linear-gradient(45deg,#c53030 0 5px,#822727 5px 10px)}
.mark{position:absolute;top:-3px;bottom:-3px;width:2px;background:#1d2430}
.bar b{font-weight:normal;text-align:right;white-space:nowrap}
.bar.warn b,.bar.crit b{font-weight:700}.bar.crit b{color:#c53030}.bar.warn b{color:#9c4221}
.note{grid-column:2/4;font-size:.9em;margin-top:-.3em}.crit .note{color:#c53030}
.warn .note{color:#9c4221}
.chips{font-size:.85em;margin:.4em 0}.chip{display:inline-block;border-radius:3px;
padding:0 .4em;margin:0 .2em .2em 0;background:#edf2f7}.chip.warn{background:#feebc8;color:#7b341e}
.chip.crit{background:#c53030;color:#fff}.chip.info{background:#ebf4ff;color:#2c5282}
.lost{font-weight:700;color:#c53030}
.mig{margin:.5em 0 0;border-top:1px solid #e2e8f0;padding-top:.3em}
.mig h3{font-size:.85em;margin:.2em 0;color:#4a5568}
.instance .bar+.bar span{padding-left:1em}
ul.alerts{margin:.5em 0 0;padding-left:0;list-style:none;font-size:.85em}
ul.alerts li{margin:.2em 0}ul.alerts li.crit{color:#c53030}ul.alerts li.warn{color:#975a16}
ul.alerts li.info{color:#2c5282}#connection{color:#c53030}
#node-alerts{font-size:.95em}
a{color:#2b6cb0}
"""

# Swaps in the page as the server renders it now: one renderer, no second copy in JavaScript.
_SCRIPT = """
(function(){
var refreshes=0;
function refresh(){
fetch('./',{cache:'no-store'}).then(function(r){if(!r.ok)throw r.status;return r.text();})
.then(function(text){
var doc=new DOMParser().parseFromString(text,'text/html');
document.getElementById('live').innerHTML=doc.getElementById('live').innerHTML;
document.title=doc.title;
document.getElementById('connection').textContent='';
refreshes+=1;document.body.setAttribute('data-refreshes',refreshes);
}).catch(function(){document.getElementById('connection').textContent=
'\\u2716 disconnected: showing the last page received';});}
setInterval(refresh,REFRESH_MS);refresh();
})();
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _clock(at: float) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return f'<time datetime="{stamp}">{time.strftime("%H:%M:%S", time.gmtime(at))} UTC</time>'


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def _runbook(url: str) -> str:
    return f' &middot; <a class="runbook" href="{_e(url)}">runbook</a>' if url else ""


def _alert_item(alert: dict[str, Any], text: str, now: float) -> str:
    state = _e(alert["phase"])
    symbol = "\u25cf" if alert["phase"] == "firing" else "\u25cc"
    severity = f" ({_e(alert['severity'])})" if alert["severity"] else ""
    since = ""
    if alert["since"] is not None:
        since = f" &middot; for {_age(now - alert['since'])}, since {_clock(alert['since'])}"
    return (
        f'<li class="{state} {alert["level"]}" data-alert="{_e(alert["alertname"])}" '
        f'data-level="{alert["level"]}">{symbol} {state} '
        f"<b>{_e(alert['alertname'])}</b>{severity}: {_e(alert[text])}{since}"
        f"{_runbook(alert['runbook_url'])}</li>"
    )


def _bar_html(bar: dict[str, Any]) -> str:
    level = bar["level"]
    mark = ""
    if bar["mark"] is not None:
        mark = f'<i class="mark" style="left:{bar["mark"] * 100:.1f}%"></i>'
    width = round((bar["ratio"] or 0) * 100)
    note = f'<span class="note">{_e(bar["note"])}</span>' if bar["note"] else ""
    return (
        f'<div class="bar {level}" data-bar="{_e(bar["name"])}" data-level="{level}">'
        f"<span>{_e(bar['name'])}</span>"
        f'<div class="track"><div class="fill" style="width:{width}%"></div>{mark}</div>'
        f"<b>{_e(bar['text'])}{LEVEL_SYMBOLS[level]}</b>{note}</div>"
    )


def _chip(level: str, text: str, attributes: str = "") -> str:
    """A chip coloured by its level, and marked by its symbol: never colour alone."""
    symbol = LEVEL_SYMBOLS[level].strip()
    mark = f"{symbol} " if symbol else ""
    return f'<span class="chip {level}" data-level="{level}"{attributes}>{mark}{_e(text)}</span>'


def _event_chip(event: dict[str, str]) -> str:
    return _chip(event["level"], event["text"])


def _chips(gpu: dict[str, Any]) -> str:
    """The active clock event reasons and the XIDs seen, as chips."""
    events = "".join(_event_chip(event) for event in gpu["clock_events"])
    line = ""
    if gpu["collection"] != "lost":
        line = f'<p class="chips" data-clock-events>Clock events: {events or "none"}</p>'
    if gpu["last_xid"] or gpu["xids"]:
        counts = ", ".join(f"{code} \u00d7{count}" for code, count in gpu["xids"].items())
        text = f"XID {counts or gpu['last_xid']}"
        if len(gpu["xids"]) > 1 and gpu["last_xid"]:
            text += f" (last {gpu['last_xid']})"
        line += f'<p class="chips" data-xid="{gpu["last_xid"]}">{_chip(gpu["xid_level"], text)}</p>'
    return line


def _mig_html(gpu: dict[str, Any]) -> str:
    if not gpu["mig"]:
        return ""
    # Without GPM (A100 and older) no instance has SM activity: said once, not per instance.
    gpm = any(m["gpm"] for m in gpu["mig"])
    rows = "".join(
        f'<div class="instance" data-mig-instance="{m["instance"]}">'
        + _bar_html({**m["bars"][0], "name": f"{m['profile']} #{m['instance']} {NOW}"})
        + (_bar_html(m["bars"][1]) if m["gpm"] else "")
        + (f'<p class="mean">{_e(m["sm_active_text"])}</p>' if m["gpm"] else "")
        + "</div>"
        for m in gpu["mig"]
    )
    no_gpm = "" if gpm else " &middot; SM activity n/a (no GPM)"
    return (
        f'<section class="mig"><h3>{len(gpu["mig"])} MIG instances: memory'
        f"{' and SM activity' if gpm else ''}{no_gpm}</h3>{rows}</section>"
    )


def _bottleneck_chip(bottleneck: dict[str, Any], mean: str) -> str:
    """One bottleneck class with the mean it was judged on; a finding with its runbook."""
    cls = "chip warn" if bottleneck["finding"] else "chip"
    symbol = "\u25b2 " if bottleneck["finding"] else ""
    text = f"{bottleneck['text']}: {bottleneck['value'] * 100:.0f}% ({mean})"
    runbook = _runbook(bottleneck["runbook_url"]) if bottleneck["finding"] else ""
    return (
        f'<span class="{cls}" data-bottleneck="{_e(bottleneck["bottleneck"])}">{symbol}'
        f"{_e(text)}{runbook}</span>"
    )


def _card(gpu: dict[str, Any], now: float, rules: dict[str, Any] | None) -> str:
    verdict = gpu["verdict"]
    severity = gpu["severity"]
    _rank, symbol, word = SEVERITIES[severity]
    evidence = "".join(f"<li>{_e(line)}</li>" for line in verdict["evidence"])
    # "none" is valued at the GPU's mean utilization, which the evidence already gives.
    shown = [b for b in verdict["bottlenecks"] if b["bottleneck"] != "none"]
    bottlenecks = ""
    if shown and rules is not None:
        mean = _mean_words(rules["window"])
        chips = "".join(_bottleneck_chip(b, mean) for b in shown)
        bottlenecks = f'<p class="chips" data-bottlenecks>Bottlenecks: {chips}</p>'
    if gpu["collection"] == "lost":
        bars = '<p class="lost">\u2716 lost: NVML answers GPU_IS_LOST, no readings</p>'
    else:
        bars = "".join(_bar_html(b) for b in gpu["bars"])
    alerts = "".join(_alert_item(a, "summary", now) for a in gpu["alerts"])
    return (
        f'<article class="card sev-{severity}" data-gpu="{gpu["index"]}" '
        f'data-verdict="{_e(verdict["activity"])}" data-severity="{severity}" '
        f'data-state="{_e(gpu["collection"])}">'
        f'<h2><span class="badge">{symbol} {word}</span> GPU {gpu["index"]} '
        f"<small>{_e(gpu['name'])}</small></h2>"
        f'<p class="uuid">{_e(gpu["uuid"])} &middot; {_e(gpu["collection"])}</p>'
        f'<p class="verdict"><strong>{_e(verdict["label"])}</strong>: {_e(verdict["summary"])}'
        f"{_runbook(verdict['runbook_url'])}</p>"
        + (f'<ul class="evidence">{evidence}</ul>' if evidence else "")
        + bottlenecks
        + bars
        + _chips(gpu)
        + _mig_html(gpu)
        + (f'<ul class="alerts">{alerts}</ul>' if alerts else "")
        + "</article>"
    )


def _summary_html(status: dict[str, Any]) -> str:
    counts = status["summary"]
    gpus = counts["gpus"]
    items = [
        ("gpus", f"{gpus} GPU{'s' if gpus != 1 else ''}", ""),
        ("lost", f"\u2716 {counts['lost']} lost", "bad"),
        ("stale", f"\u25b2 {counts['stale']} stale", "warn"),
        ("faults", f"\u2716 {counts['faults']} fault{'s' if counts['faults'] != 1 else ''}", "bad"),
        (
            "warnings",
            f"\u25b2 {counts['warnings']} warning{'s' if counts['warnings'] != 1 else ''}",
            "warn",
        ),
        ("firing", f"\u25cf {counts['firing']} firing", "bad"),
        ("pending", f"\u25cc {counts['pending']} pending", "warn"),
        ("info", f"\u25cf {counts['info']} info", "info"),
    ]
    chips = "".join(
        f'<li class="{cls if counts[key] else "zero"}" data-count="{key}">{_e(text)}</li>'
        for key, text, cls in items
        if key != "stale" or counts[key]
    )
    attributes = " ".join(
        f'data-{key}="{value}"' for key, value in counts.items() if isinstance(value, int)
    )
    return f'<ul class="summary" id="summary" {attributes}>{chips}</ul>'


def title(status: dict[str, Any]) -> str:
    """The tab's title: what a person needs to tell nodes' tabs apart and spot a bad one."""
    counts = status["summary"]
    parts = [f"{counts[key]} {key}" for key in ("lost", "firing") if counts[key]]
    if status["nvml"] == "down":
        parts.insert(0, "NVML down")
    if not parts:
        problems = counts["faults"] + counts["warnings"]
        parts = [f"{problems} need a look"] if problems else ["OK"]
    simulated = "SIMULATED " if status["simulated"] else ""
    return f"{simulated}{status['hostname']} \u00b7 {', '.join(parts)} \u00b7 gpuload"


def _updated(status: dict[str, Any], now: float) -> str:
    if status["updated_at"] is None:
        return "pending"
    return f"{_clock(status['updated_at'])} ({_age(now - status['updated_at'])} ago)"


def page(status: dict[str, Any], telemetry_path: str, now: float | None = None) -> str:
    """The whole page, rendered on the server; ``now`` dates the ages (default: the snapshot)."""
    if now is None:
        now = status["updated_at"] or 0.0
    ordered = sorted(status["gpus"], key=lambda g: (SEVERITIES[g["severity"]][0], g["index"]))
    cards = "".join(_card(gpu, now, status["rules"]) for gpu in ordered)
    if not cards:
        cards = "<p>no GPUs</p>"
        if status["updated_at"] is None:
            cards = "<p>first collection pending</p>"
        elif status["nvml"] == "down":
            cards = "<p>no GPU readings while NVML is down</p>"
    node_alerts = "".join(_alert_item(a, "description", now) for a in status["alerts"])
    refresh_ms = int(status["refresh_seconds"] * 1000)
    path = _e(telemetry_path)
    simulated = ""
    if status["simulated"]:
        simulated = (
            f'<p class="sim" id="simulated">\u25a0 SIMULATED &middot; scenario '
            f"{_e(status['simulated'])}: these GPUs are not real</p>"
        )
    warming = ""
    if status["rules"] is not None and status["rules"]["warming_up"]:
        warming = (
            '<p class="warming" id="warming-up">\u25cc Warming up: the rules\' '
            f"{_e(warm_up_words(status['rules']))}; until then every verdict is provisional</p>"
        )
    nvml_down = ""
    if status["nvml"] == "down":
        nvml_down = (
            '<p class="nvml-down" id="nvml-down">\u2716 NVML is down: no GPU can be read '
            "(the driver is not loaded or does not answer; see the exporter's log)</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title(status))}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="{max(2, refresh_ms // 1000 * 5)}"></noscript>
<style>{_STYLE}</style></head><body data-refreshes="0">
<div id="live">
<header>{simulated}
<h1><span id="hostname">{_e(status["hostname"])}</span>
<small>gpuload {_e(status["version"])}</small></h1>
{_summary_html(status)}{nvml_down}{warming}
<p class="meta">NVML: <span id="nvml">{_e(status["nvml"])}</span> &middot; updated
<span id="updated">{_updated(status, now)}</span> &middot; <a href="{path}">Metrics</a>
&middot; <a href="/healthz">Health</a> &middot; <a href="/readyz">Readiness</a> &middot;
<a href="/api/v1/status">JSON</a></p></header>
<ul class="alerts" id="node-alerts">{node_alerts}</ul>
<main id="gpus">{cards}</main>
</div>
<p id="connection"></p>
<script>{_SCRIPT.replace("REFRESH_MS", str(refresh_ms))}</script>
</body></html>
"""
