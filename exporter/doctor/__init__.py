"""`gpuload doctor`: sample the GPUs, evaluate the shipped rules, and say per GPU what they found.

- :mod:`exporter.doctor.sampling` gathers the samples into a local evaluator: from NVML (or the
  simulator, on the scenario's clock) through the exporter's own collection cycle, or from a
  Prometheus server for a remote node, replayed scrape by scrape.
- :mod:`exporter.alerting.states` reads each GPU's recorded state, bottleneck classes and alerts
  from the evaluation: the doctor judges nothing itself.
- :mod:`exporter.doctor.node` groups alike GPUs; :mod:`exporter.doctor.xids` lists the XIDs.
- :mod:`exporter.doctor.runbooks` takes the next steps from ``docs/runbooks.md``.
- :mod:`exporter.doctor.command` runs it all and prints the report (text or JSON).
"""
