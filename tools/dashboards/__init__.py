"""gpuload's Grafana dashboards, built from compact Python definitions.

One module per dashboard (:mod:`.fleet`, :mod:`.node`, :mod:`.bottlenecks`) lists its panels and
their PromQL; :mod:`.grafana` turns them into Grafana JSON (ids, grid positions, units,
thresholds, the datasource variable) the same way every time. Thresholds come from
:func:`exporter.alerting.thresholds.load`, the definition the alert rules use.
``python -m tools.dashboards.render`` writes ``grafana/dashboards/*.json``.
"""
