"""A simulated NVML for machines without a GPU.

The simulator stands where the NVIDIA driver's ``libnvidia-ml.so`` stands: it is installed as
``pynvml.nvmlLib`` and answers the C function calls pynvml makes, from a scenario file describing
a node's GPUs, their load over time and faults. Everything above it (pynvml, our ``nvml`` layer,
the collectors, third-party tools run through ``gpuload sim exec``) runs unchanged.
"""

from __future__ import annotations

from exporter.sim.exec import exec_command
from exporter.sim.installer import install, install_from_env, uninstall
from exporter.sim.library import FUNCTION_NAMES, SimulatedNvml
from exporter.sim.scenario import (
    Scenario,
    ScenarioError,
    describe_scenarios,
    load_scenario,
    scenario_names,
)

__all__ = [
    "FUNCTION_NAMES",
    "Scenario",
    "ScenarioError",
    "SimulatedNvml",
    "describe_scenarios",
    "exec_command",
    "install",
    "install_from_env",
    "load_scenario",
    "scenario_names",
    "uninstall",
]
