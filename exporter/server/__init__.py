"""The `gpuload serve` daemon: its HTTP application (/metrics, the status page) and its loop."""
