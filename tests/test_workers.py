"""The GPU collections' threads: reused when idle, one more only when every one is busy."""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, wait

import pytest

from exporter.workers import Workers


def test_results_and_exceptions_reach_the_futures() -> None:
    workers = Workers(limit=2, name="t")
    try:
        assert workers.submit(lambda a, b: a + b, 2, 3).result(timeout=5) == 5
        failed = workers.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=5)
    finally:
        workers.stop()


def test_the_thread_idle_last_takes_the_next_task() -> None:
    # Grown to 8 threads once, two lanes (each task started as another returns) then keep
    # to 2 of them; the stdlib pool woke its idle threads in turn and used all 8.
    workers = Workers(limit=8, name="t")

    def task() -> int:
        for _ in range(20):
            time.sleep(25e-6)  # lets the other lane's thread in, as an NVML call does
        return threading.get_ident()

    try:
        go = threading.Event()
        started = [workers.submit(go.wait, 30) for _ in range(8)]  # all busy: 8 threads
        go.set()
        # A thread counts itself idle before it hands back its result: all 8 are idle now.
        assert all(future.result(timeout=30) for future in started)
        running, left, seen = {workers.submit(task) for _ in range(2)}, 60, set()
        while running:
            done, running = wait(running, timeout=10, return_when=FIRST_COMPLETED)
            assert done, "a task never returned"
            seen |= {future.result() for future in done}
            for _ in range(min(len(done), left)):
                running.add(workers.submit(task))
                left -= 1
    finally:
        workers.stop()
    assert len(seen) == 2


def test_a_blocked_task_holds_only_its_own_thread_up_to_the_limit() -> None:
    release = threading.Event()
    workers = Workers(limit=2, name="t")
    try:
        stuck = workers.submit(release.wait, 30)
        assert workers.submit(lambda: "other").result(timeout=5) == "other"
        # Both threads busy: a third task waits for one of them, then runs.
        second = workers.submit(release.wait, 30)
        waiting = workers.submit(lambda: "waited")
        assert not waiting.done()
        release.set()
        assert waiting.result(timeout=5) == "waited"
        assert stuck.result(timeout=5) and second.result(timeout=5)
    finally:
        release.set()
        workers.stop()


def test_stop_cancels_waiting_tasks_and_refuses_new_ones() -> None:
    release = threading.Event()
    workers = Workers(limit=1, name="t")
    busy = workers.submit(release.wait, 30)
    waiting = workers.submit(lambda: "never")
    workers.stop()
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="stopped"):
        workers.submit(lambda: None)
    release.set()
    assert busy.result(timeout=5)  # a task already running finishes


def test_threads_end_after_stop() -> None:
    workers = Workers(limit=3, name="workers-end")
    for future in [workers.submit(lambda: None) for _ in range(3)]:
        future.result(timeout=5)
    workers.stop()
    for thread in threading.enumerate():
        if thread.name.startswith("workers-end"):
            thread.join(timeout=5)
            assert not thread.is_alive()
