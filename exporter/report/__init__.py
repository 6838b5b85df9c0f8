"""`gpuload report`: GPU-hours allocated, used and idle per namespace and owner, and their cost.

It reads the accounting rules' series (:mod:`exporter.alerting.accounting`) from a
Prometheus-compatible query API over a period (:mod:`~exporter.report.period`), sums them
(:mod:`~exporter.report.ledger`) and prints them (:mod:`~exporter.report.render`) or sends them
as one message through a relay target (:mod:`~exporter.report.delivery`).
"""
