"""Serving: the HTTP endpoint and the `gpuload serve` daemon."""
