"""The live status page (`/`) and its JSON (`/api/v1/status`).

One card per GPU: utilization, memory, memory bandwidth, temperature and power as bars, the
doctor's verdict over the last 30 seconds, and the local alerts pending or firing on it. The page
is complete as the server renders it (no JavaScript needed; a ``<noscript>`` refresh reloads it);
a small inline script then refreshes the cards from the JSON every collection interval. No
external assets, no framework: the page works on an air-gapped node.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from exporter import __version__
from exporter.alerting.evaluator import Alert
from exporter.alerting.history import Sample, snapshot_samples
from exporter.alerting.local import LocalAlerting
from exporter.collection import Snapshot
from exporter.doctor.sampling import window_of
from exporter.doctor.verdicts import Report, diagnose

StartResponse = Callable[..., Any]
# The doctor's window on the status page.
VERDICT_SECONDS = 30.0


def _ratio(value: float | None, total: float | None) -> float | None:
    if value is None or not total:
        return None
    return max(0.0, min(1.0, value / total))


def _bar(name: str, ratio: float | None, text: str) -> dict[str, Any]:
    return {"name": name, "ratio": ratio, "text": text if ratio is not None else "n/a"}


def _by_gpu(samples: list[Sample], name: str, **matchers: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for sample in samples:
        label = dict(sample.labels)
        if sample.name != name or "gpu" not in label or "mig_instance" in label:
            continue
        if all(label.get(k) == v for k, v in matchers.items()):
            found.setdefault(label["gpu"], sample.value)
    return found


def _alert_json(alert: Alert) -> dict[str, Any]:
    return {
        "alertname": alert.name,
        "severity": alert.labels.get("severity", ""),
        "state": alert.state,
        "summary": alert.annotations.get("summary", ""),
        "description": alert.annotations.get("description", ""),
        "runbook_url": alert.annotations.get("runbook_url", ""),
        "since": alert.firing_since if alert.firing_since is not None else alert.active_since,
    }


class StatusPage:
    """The WSGI app behind `/` and `/api/v1/status`."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        telemetry_path: str,
        alerting: LocalAlerting | None,
        refresh_seconds: float,
    ) -> None:
        self._latest = latest
        self._telemetry_path = telemetry_path
        self._alerting = alerting
        self._refresh = max(1.0, refresh_seconds)
        self._lock = threading.Lock()
        self._verdicts: tuple[float, dict[str, Report]] = (0.0, {})
        # DRAM bandwidth is a counter of seconds (the last-interval ratio is not in the default
        # profile): its rate between the two last snapshots this page saw, per GPU.
        self._dram: dict[str, tuple[float, float]] = {}
        self._dram_ratio: dict[str, float] = {}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Serve the page or its JSON."""
        status = self.status()
        if environ.get("PATH_INFO") == "/api/v1/status":
            start_response(
                "200 OK",
                [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
            )
            return [json.dumps(status).encode()]
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [page(status, self._telemetry_path).encode()]

    def _reports(self, snapshot: Snapshot) -> dict[str, Report]:
        if self._alerting is None:
            return {}
        # The doctor runs at most once per collection, however many browsers poll.
        with self._lock:
            at, reports = self._verdicts
            if at != snapshot.completed_at:
                window = window_of(self._alerting.history, VERDICT_SECONDS)
                found = diagnose(window, self._alerting.evaluator.thresholds)
                reports = {report.gpu: report for report in found}
                self._verdicts = (snapshot.completed_at, reports)
            return reports

    def status(self) -> dict[str, Any]:
        """The JSON document of `/api/v1/status`."""
        snapshot = self._latest()
        document: dict[str, Any] = {
            "version": __version__,
            "refresh_seconds": self._refresh,
            "nvml": "starting",
            "updated_at": None,
            "gpus": [],
            "alerts": [],
        }
        if snapshot is None:
            return document
        document["nvml"] = "up" if snapshot.nvml_up else "down"
        document["updated_at"] = snapshot.completed_at
        current = self._alerting.alerts() if self._alerting is not None else []
        alerts = sorted(current, key=lambda a: (a.state != "firing", a.name))
        document["alerts"] = [_alert_json(a) for a in alerts if "gpu" not in a.labels]
        reports = self._reports(snapshot)
        history = list(snapshot_samples(snapshot))
        values = {
            "util": _by_gpu(history, "gpu_utilization_ratio"),
            "used": _by_gpu(history, "gpu_memory_used_bytes"),
            "total": _by_gpu(history, "gpu_memory_total_bytes"),
            "dram": self._dram_rates(
                snapshot.completed_at, _by_gpu(history, "gpu_dram_active_seconds_total")
            ),
            "memutil": _by_gpu(history, "gpu_memory_utilization_ratio"),
            "temp": _by_gpu(history, "gpu_temperature_celsius", sensor="gpu"),
            "shutdown": _by_gpu(history, "gpu_temperature_shutdown_threshold_celsius"),
            "slowdown": _by_gpu(history, "gpu_temperature_slowdown_threshold_celsius"),
            "power": _by_gpu(history, "gpu_power_usage_watts"),
            "limit": _by_gpu(history, "gpu_power_limit_watts"),
        }
        for gpu in snapshot.gpus:
            key = str(gpu.index)
            document["gpus"].append(
                self._gpu(gpu.index, gpu.name, gpu.uuid, gpu, values, reports.get(key), alerts)
            )
        return document

    def _dram_rates(self, now: float, seconds: dict[str, float]) -> dict[str, float]:
        with self._lock:
            for gpu, total in seconds.items():
                before = self._dram.get(gpu)
                if before is not None and now > before[0] and total >= before[1]:
                    self._dram_ratio[gpu] = min(1.0, (total - before[1]) / (now - before[0]))
                if before is None or now > before[0]:
                    self._dram[gpu] = (now, total)
            return {gpu: self._dram_ratio[gpu] for gpu in seconds if gpu in self._dram_ratio}

    def _gpu(
        self,
        index: int,
        name: str,
        uuid: str,
        gpu: Any,
        values: dict[str, dict[str, float]],
        report: Report | None,
        alerts: list[Alert],
    ) -> dict[str, Any]:
        key = str(index)

        def get(what: str) -> float | None:
            return values[what].get(key)

        used, total = get("used"), get("total")
        bandwidth = get("dram")
        bandwidth_name = "DRAM bandwidth" if bandwidth is not None else "Memory busy"
        if bandwidth is None:
            bandwidth = get("memutil")
        temp, ceiling = get("temp"), get("shutdown") or get("slowdown")
        power, limit = get("power"), get("limit")
        bars = [
            _bar("Utilization", get("util"), f"{(get('util') or 0) * 100:.0f}%"),
            _bar(
                "Memory",
                _ratio(used, total),
                f"{(used or 0) / 2**30:.1f} / {(total or 0) / 2**30:.0f} GiB",
            ),
            _bar(bandwidth_name, bandwidth, f"{(bandwidth or 0) * 100:.0f}%"),
            _bar(
                "Temperature",
                _ratio(temp, ceiling or 100.0),
                f"{temp or 0:.0f} °C",
            ),
            _bar("Power", _ratio(power, limit), f"{power or 0:.0f} / {limit or 0:.0f} W"),
        ]
        verdict = {"state": "unknown", "summary": "not enough samples yet", "healthy": True}
        if report is not None:
            verdict = {
                "state": report.state,
                "summary": report.findings[0].summary if report.findings else "",
                "healthy": report.healthy,
                "runbook_url": report.findings[0].runbook if report.findings else "",
            }
        return {
            "index": index,
            "name": name,
            "uuid": uuid,
            "state": "stale" if gpu.stale else "up" if gpu.up else "lost",
            "bars": bars,
            "verdict": verdict,
            "alerts": [_alert_json(a) for a in alerts if a.labels.get("gpu") == key],
        }


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;background:#f6f7f9;color:#1d2430}
header p{margin:.2em 0;color:#4a5568}
#gpus{display:grid;grid-template-columns:repeat(auto-fill,minmax(19em,1fr));gap:1em;margin:1em 0}
.card{background:#fff;border-radius:8px;padding:.8em 1em;border-left:6px solid #38a169;
box-shadow:0 1px 3px rgba(0,0,0,.12)}
.card.finding{border-left-color:#dd6b20}.card.fault{border-left-color:#e53e3e}
.card h2{font-size:1.05em;margin:0}.card h2 small{font-weight:normal;color:#4a5568}
.uuid{font-family:monospace;font-size:.75em;color:#718096;margin:.2em 0 .5em}
.verdict{font-weight:600;margin:.3em 0 .6em}
.bar{display:grid;grid-template-columns:9em 1fr 7.5em;align-items:center;gap:.5em;
font-size:.85em;margin:.25em 0}
.track{background:#e2e8f0;border-radius:4px;height:.7em;overflow:hidden}
.fill{background:#3182ce;height:100%}.bar b{font-weight:normal;text-align:right}
.alerts{margin:.5em 0 0;padding-left:1.1em;font-size:.85em}.firing{color:#c53030}
.pending{color:#975a16}table{border-collapse:collapse;font-size:.85em}
td,th{padding:.2em .8em;text-align:left}
"""

# Renders the same cards from /api/v1/status; kept in step with _card() below.
_SCRIPT = """
(function(){
var refreshes=0;
function esc(s){return String(s==null?'':s).replace(/[&<>"']/g,function(c){
return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c];});}
function card(g){
var v=g.verdict,cls=g.state!=='up'||v.state==='hardware-fault'?'fault':(v.healthy?'':'finding');
var h='<article class="card '+cls+'" data-gpu="'+g.index+'" data-verdict="'+esc(v.state)+'">';
h+='<h2>GPU '+g.index+' <small>'+esc(g.name)+'</small></h2><p class="uuid">'+esc(g.uuid)+
' &middot; '+esc(g.state)+'</p>';
h+='<p class="verdict">'+esc(v.state)+': '+esc(v.summary)+'</p>';
g.bars.forEach(function(b){var w=b.ratio==null?0:Math.round(b.ratio*100);
h+='<div class="bar"><span>'+esc(b.name)+'</span><div class="track"><div class="fill" '+
'style="width:'+w+'%"></div></div><b>'+esc(b.text)+'</b></div>';});
if(g.alerts.length){h+='<ul class="alerts">';g.alerts.forEach(function(a){
h+='<li class="'+esc(a.state)+'">'+esc(a.state)+' '+esc(a.alertname)+': '+esc(a.summary)+'</li>';});
h+='</ul>';}
return h+'</article>';}
function alerts(list){return list.map(function(a){return '<li class="'+esc(a.state)+'">'+
esc(a.state)+' '+esc(a.alertname)+': '+esc(a.description)+'</li>';}).join('');}
function refresh(){
fetch('/api/v1/status',{cache:'no-store'}).then(function(r){return r.json();}).then(function(s){
document.getElementById('gpus').innerHTML=s.gpus.map(card).join('');
document.getElementById('node-alerts').innerHTML=alerts(s.alerts);
document.getElementById('nvml').textContent=s.nvml;
document.getElementById('updated').textContent=s.updated_at?
new Date(s.updated_at*1000).toLocaleTimeString():'pending';
document.getElementById('connection').textContent='';
refreshes+=1;document.body.setAttribute('data-refreshes',refreshes);
}).catch(function(){document.getElementById('connection').textContent=' (disconnected)';});}
setInterval(refresh,REFRESH_MS);refresh();
})();
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _alert_item(alert: dict[str, Any], text: str) -> str:
    state = _e(alert["state"])
    return f'<li class="{state}">{state} {_e(alert["alertname"])}: {_e(alert[text])}</li>'


def _card(gpu: dict[str, Any]) -> str:
    verdict = gpu["verdict"]
    fault = gpu["state"] != "up" or verdict["state"] == "hardware-fault"
    cls = "fault" if fault else ("" if verdict["healthy"] else "finding")
    bars = "".join(
        f'<div class="bar"><span>{_e(b["name"])}</span><div class="track"><div class="fill" '
        f'style="width:{round((b["ratio"] or 0) * 100)}%"></div></div><b>{_e(b["text"])}</b></div>'
        for b in gpu["bars"]
    )
    alerts = "".join(_alert_item(a, "summary") for a in gpu["alerts"])
    return (
        f'<article class="card {cls}" data-gpu="{gpu["index"]}" '
        f'data-verdict="{_e(verdict["state"])}">'
        f"<h2>GPU {gpu['index']} <small>{_e(gpu['name'])}</small></h2>"
        f'<p class="uuid">{_e(gpu["uuid"])} &middot; {_e(gpu["state"])}</p>'
        f'<p class="verdict">{_e(verdict["state"])}: {_e(verdict["summary"])}</p>{bars}'
        + (f'<ul class="alerts">{alerts}</ul>' if alerts else "")
        + "</article>"
    )


def page(status: dict[str, Any], telemetry_path: str) -> str:
    """The whole page, rendered on the server."""
    cards = "".join(_card(gpu) for gpu in status["gpus"])
    if not cards:
        cards = (
            "<p>first collection pending</p>" if status["updated_at"] is None else "<p>no GPUs</p>"
        )
    node_alerts = "".join(_alert_item(a, "description") for a in status["alerts"])
    refresh_ms = int(status["refresh_seconds"] * 1000)
    path = _e(telemetry_path)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuload</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="{max(2, refresh_ms // 1000 * 5)}"></noscript>
<style>{_STYLE}</style></head><body data-refreshes="0">
<header><h1>gpuload {_e(__version__)}</h1>
<p>NVML: <span id="nvml">{_e(status["nvml"])}</span> &middot; updated
<span id="updated">{"pending" if status["updated_at"] is None else "at first paint"}</span><span
id="connection"></span> &middot; <a href="{path}">Metrics</a> &middot;
<a href="/healthz">Health</a> &middot; <a href="/readyz">Readiness</a> &middot;
<a href="/api/v1/status">JSON</a></p></header>
<ul class="alerts" id="node-alerts">{node_alerts}</ul>
<main id="gpus">{cards}</main>
<script>{_SCRIPT.replace("REFRESH_MS", str(refresh_ms))}</script>
</body></html>
"""
