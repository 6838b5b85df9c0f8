"""The local-alerting benchmark (bench/evaluation.py): simulated samples, both intervals timed."""

from __future__ import annotations

from bench import evaluation


def test_node_samples_are_the_kept_families_of_an_8_gpu_node() -> None:
    (samples,) = evaluation.node_samples(1)
    names = {sample.name for sample in samples}
    assert "gpu_utilization_seconds_total" in names
    assert {dict(s.labels)["gpu"] for s in samples if s.name == "gpu_up"} == {
        str(i) for i in range(8)
    }
    # Only what the evaluator and the verdicts keep: the NVLink totals per GPU that the
    # bottleneck classes read, no per-link series.
    assert "gpu_nvlink_receive_bytes_total" in names
    assert not any("link" in dict(sample.labels) for sample in samples)


def test_each_interval_gets_one_figure_per_round() -> None:
    figures = evaluation.run(rounds=2, cycles=3, warm=20)
    assert set(figures) == set(evaluation.INTERVALS)
    assert all(len(values) == 2 and all(v >= 0 for v in values) for values in figures.values())
