"""gpuload: a GPU load exporter and alerting daemon for machine-learning clusters."""

__version__ = "0.1.0"
