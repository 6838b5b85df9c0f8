"""Alerting: the one definition of the alert thresholds and the rule files rendered from it.

- :mod:`exporter.alerting.thresholds` reads and validates ``alert_rules/thresholds.yaml``.
- :mod:`exporter.alerting.rules` builds the Prometheus recording and alerting rules from it.
- :mod:`tools.render_rules` writes (or checks) the committed files in ``alert_rules/``.
"""
