"""glibc's malloc settings: applied to the daemon, handed to the front, a user's own kept."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"]


def _in_a_fresh_process(code: str, **env: str) -> object:
    clean = {k: v for k, v in os.environ.items() if k not in NAMES}
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); {code}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**clean, **env},
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_both_settings_are_applied_unless_the_environment_sets_them() -> None:
    tune = "import json; from exporter.server import malloc; print(json.dumps(malloc.tune()))"
    assert _in_a_fresh_process(tune) == NAMES
    assert _in_a_fresh_process(tune, MALLOC_ARENA_MAX="4") == ["MALLOC_MMAP_THRESHOLD_"]


def test_a_child_gets_the_settings_and_keeps_a_users_own() -> None:
    child = (
        "import json; from exporter.server import malloc; "
        f"print(json.dumps([malloc.child_environment().get(n) for n in {NAMES!r}]))"
    )
    assert _in_a_fresh_process(child) == ["2", "131072"]
    assert _in_a_fresh_process(child, MALLOC_ARENA_MAX="8") == ["8", "131072"]
