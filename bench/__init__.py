"""gpuload's benchmark: gpuload and nvitop-exporter side by side on simulated nodes, and the relay.

``python -m bench`` runs it, prints a table and rewrites ``bench/RESULTS.md``; see bench/README.md.
"""
