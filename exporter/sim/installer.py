"""Putting the simulated NVML in place of the real library inside pynvml, and taking it out.

pynvml keeps the loaded library in ``pynvml.nvmlLib`` and loads ``libnvidia-ml.so.1`` only while
that is None, so installing the simulator there before ``nvmlInit`` makes every pynvml call in the
process use it. pynvml also caches the functions it looked up, so both directions clear that cache.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping

import pynvml

from exporter.sim.library import SimulatedNvml
from exporter.sim.scenario import CALLERS, Scenario, ScenarioError, load_scenario

ENV_SCENARIO = "GPULOAD_SIM_SCENARIO"
ENV_EPOCH = "GPULOAD_SIM_EPOCH"
ENV_SEED = "GPULOAD_SIM_SEED"
ENV_TIME = "GPULOAD_SIM_TIME"
ENV_CALLER = "GPULOAD_SIM_CALLER"
# Where the parent found PyYAML: appended to a child's path by site/sitecustomize.py.
ENV_DEPENDENCIES = "GPULOAD_SIM_DEPENDENCIES"


def _reset_pynvml(library: SimulatedNvml | None) -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        # A fresh library has no open sessions, whatever the previous one had.
        pynvml._nvmlLib_refcount = 0


def install(
    scenario: Scenario | str | os.PathLike[str],
    *,
    epoch: float | None = None,
    clock: Callable[[], float] | None = None,
    pinned_time: float | None = None,
    seed: int | None = None,
    caller: str | None = None,
    hang: Callable[[float], object] = time.sleep,
    sleep: Callable[[float], object] = time.sleep,
) -> SimulatedNvml:
    """Build a :class:`SimulatedNvml` for ``scenario`` and make pynvml use it.

    Args:
        scenario: a loaded scenario, a shipped scenario name or a scenario file path.
        epoch: unix time at which the scenario starts; defaults to ``clock()`` now.
        clock: the time source, ``time.time`` by default; tests pass a controllable one.
        pinned_time: freeze the scenario at this many elapsed seconds.
        seed: overrides the scenario's seed (noise, UUIDs, serials, PIDs).
        caller: overrides the scenario's ``caller`` (root, unprivileged,
            unprivileged-no-host-pid): who the driver believes is calling.
        hang: what a call under a ``hang`` fault does with its seconds: sleeps them by default;
            a test passes one that returns when the test says so.
        sleep: what a call does with its ``driver.latency``: sleeps it by default; a test
            passes one that records it, or that waits for the other callers.

    Returns:
        The installed simulator; its ``calls`` counter shows what pynvml asked for.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    if caller is not None:
        if caller not in CALLERS:
            raise ScenarioError(f"caller: expected one of {', '.join(CALLERS)}, got {caller!r}")
        scenario = dataclasses.replace(scenario, caller=caller)
    library = SimulatedNvml(
        scenario,
        epoch=epoch,
        clock=clock or time.time,
        pinned_time=pinned_time,
        seed=seed,
        hang=hang,
        sleep=sleep,
    )
    _reset_pynvml(library)
    return library


def uninstall() -> None:
    """Remove the simulator: pynvml will load the real library on the next ``nvmlInit``."""
    _reset_pynvml(None)


def _parse(environ: Mapping[str, str], name: str, convert: Callable[[str], float]) -> float | None:
    text = environ.get(name)
    if text is None or text == "":
        return None
    try:
        return convert(text)
    except ValueError:
        raise ValueError(f"{name}: expected a number, got {text!r}") from None


def install_from_env(environ: Mapping[str, str]) -> SimulatedNvml | None:
    """Install the simulator described by ``GPULOAD_SIM_*`` variables, if any.

    ``GPULOAD_SIM_SCENARIO`` (name or file) turns it on; ``GPULOAD_SIM_EPOCH`` (unix seconds),
    ``GPULOAD_SIM_SEED``, ``GPULOAD_SIM_TIME`` (pinned elapsed seconds) and
    ``GPULOAD_SIM_CALLER`` (root, unprivileged, unprivileged-no-host-pid) are optional.

    Returns:
        The installed simulator, or None when ``GPULOAD_SIM_SCENARIO`` is unset.

    Raises:
        ValueError: a variable does not parse (ScenarioError for a bad scenario).
    """
    scenario = environ.get(ENV_SCENARIO)
    if not scenario:
        return None
    seed = _parse(environ, ENV_SEED, int)
    return install(
        scenario,
        epoch=_parse(environ, ENV_EPOCH, float),
        pinned_time=_parse(environ, ENV_TIME, float),
        seed=None if seed is None else int(seed),
        caller=environ.get(ENV_CALLER) or None,
    )
