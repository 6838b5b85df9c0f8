"""`python -m exporter` runs the `gpuload` command line."""

import sys

from exporter.cli import main

sys.exit(main())
