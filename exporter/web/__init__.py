"""The HTTP layer both daemons stand on: the server, the web config file and the answers.

`gpuload serve` and `gpuload relay` share it; it knows neither of them (nothing here imports
the exporter's daemon, the relay or the alerting).
"""
