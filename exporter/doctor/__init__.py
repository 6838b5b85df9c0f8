"""`gpuload doctor`: sample the GPUs for a short window and say, per GPU, what holds it back.

- :mod:`exporter.doctor.sampling` gathers the window: from NVML (or the simulator) through the
  exporter's own collection cycle, or from a Prometheus server for a remote node.
- :mod:`exporter.doctor.verdicts` turns the window into one state per GPU with its evidence,
  using the thresholds of the shipped alerts where there is one.
- :mod:`exporter.doctor.runbooks` takes the next steps from ``docs/runbooks.md``.
- :mod:`exporter.doctor.command` runs it all and prints the report (text or JSON).
"""
