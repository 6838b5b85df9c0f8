"""The chart's weekly report CronJob: off by default, in its time zone, sending through the relay.

Rendered by Helm's own engine (tests/test_helm_chart.py's helpers); the CronJob validates against
the Kubernetes schemas, and its arguments and relay configuration are ones `gpuload report`
accepts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from test_helm_chart import CHART, WITH_RELAY, render_objects, the, validate_core

from exporter import cli
from exporter.relay import config as relay_config

REPORT: dict[str, Any] = {
    **WITH_RELAY,
    "report": {
        "enabled": True,
        "prometheusUrl": "http://prometheus-operated.monitoring:9090",
        "timeZone": "Europe/Berlin",
        "prices": {"H100": 2.5},
        "defaultPrice": 1.8,
        "currency": "EUR",
        "target": "ops",
    },
}


@pytest.fixture(scope="module")
def loaded() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as chart:
        yield chart


def test_the_report_is_off_by_default(loaded: helm.Chart) -> None:
    assert "CronJob" not in {o["kind"] for o in render_objects(loaded, WITH_RELAY)}


def test_the_cronjob_runs_the_report_in_its_time_zone_and_sends_it_through_the_relay(
    loaded: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render_objects(loaded, REPORT)
    job = the(objects, "CronJob", "gpuload-report")
    validate_core(job)
    assert job["spec"]["schedule"] == "0 8 * * 1"
    assert job["spec"]["timeZone"] == "Europe/Berlin"
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "report"
    assert "--tz=Europe/Berlin" in args and "--last-week" in args
    assert "--price=H100=2.5" in args and "--default-price=1.8" in args
    assert "--target=ops" in args
    parsed = cli.build_parser().parse_args(args)
    assert (parsed.tz, parsed.last_week, parsed.currency) == ("Europe/Berlin", True, "EUR")
    # The relay's own configuration, with the secrets it names: one `gpuload report` can load.
    relay = the(objects, "ConfigMap", "gpuload-relay")
    path = tmp_path / "relay.yaml"
    path.write_text(relay["data"]["relay.yaml"], encoding="utf-8")
    environ = {env["name"]: "http://127.0.0.1:9/hook" for env in container["env"]}
    loaded_config = relay_config.load(file=path, environ=environ)
    assert set(loaded_config.targets) == {"ops"}
    assert pod["volumes"][0]["configMap"]["name"] == "gpuload-relay"


def test_without_a_target_the_report_goes_to_the_jobs_log(loaded: helm.Chart) -> None:
    values = {**REPORT, "report": {**REPORT["report"], "target": ""}}
    job = the(render_objects(loaded, values), "CronJob", "gpuload-report")
    container = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert not any(arg.startswith("--target") for arg in container["args"])
    assert "env" not in container and "volumeMounts" not in container


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ({"prometheusUrl": ""}, "report.prometheusUrl: give the Prometheus-compatible query API"),
        ({"target": "pager"}, 'report.target: "pager" is not one of relay.targets'),
    ],
)
def test_bad_report_values_say_what_to_set(
    loaded: helm.Chart, report: dict[str, Any], message: str
) -> None:
    values = {**REPORT, "report": {**REPORT["report"], **report}}
    with pytest.raises(Exception, match=message.replace(".", r"\.")):
        render_objects(loaded, values)


def test_values_document_the_report() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert values["report"]["enabled"] is False
    assert values["report"]["timeZone"] == "UTC"
