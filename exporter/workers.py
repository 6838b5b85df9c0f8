"""Threads for the GPUs' collections: the most recently idle one is reused.

`concurrent.futures.ThreadPoolExecutor` counts a thread idle only after it has set its
future's result. The collection starts a GPU the moment another GPU's collection returns,
so it found no idle thread and started one more: the pool grew to one thread per GPU, and
each collection ran on a thread that had not run for a while. Here a thread counts itself
idle before it hands back its result, and the one that was idle last takes the next task:
two lanes keep two threads busy, and a thread stuck in a hung NVML call holds only itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")

# A task for a worker, or None: stop.
_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None


class Workers:
    """Up to ``limit`` threads, each started only when every other one is busy."""

    def __init__(self, limit: int, name: str) -> None:
        self._limit = max(1, limit)
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[SimpleQueue[_Task]] = []  # a stack: the last idle is reused first
        self._started = 0
        self._waiting: SimpleQueue[_Task] = SimpleQueue()  # tasks while all are busy
        self._stopped = False

    def submit(self, function: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``function(*args)`` on a worker; its future holds what it returns or raises."""
        future: Future[T] = Future()
        with self._lock:
            if self._stopped:
                raise RuntimeError("workers stopped")
            if self._idle:
                self._idle.pop().put((future, function, args))
            elif self._started < self._limit:
                self._started += 1
                inbox: SimpleQueue[_Task] = SimpleQueue()
                inbox.put((future, function, args))
                name = f"{self._name}_{self._started - 1}"
                threading.Thread(target=self._work, args=(inbox,), name=name, daemon=True).start()
            else:
                self._waiting.put((future, function, args))
        return future

    def stop(self) -> None:
        """Stop the idle threads now and the busy ones when they return; cancel what waits."""
        with self._lock:
            self._stopped = True
            for inbox in self._idle:
                inbox.put(None)
            self._idle.clear()
            while not self._waiting.empty():
                task = self._waiting.get()
                if task is not None:
                    task[0].cancel()

    def _work(self, inbox: SimpleQueue[_Task]) -> None:
        task = inbox.get()
        while task is not None:
            future, function, args = task
            if future.set_running_or_notify_cancel():
                try:
                    result = function(*args)
                except BaseException as error:  # noqa: BLE001 (the future re-raises it, as the stdlib pool does)
                    task = self._next(inbox)
                    future.set_exception(error)
                else:
                    task = self._next(inbox)
                    future.set_result(result)
                del future, function, args  # no reference kept while idle
            else:
                task = self._next(inbox)
            if task is None:
                task = inbox.get()

    def _next(self, inbox: SimpleQueue[_Task]) -> _Task:
        """A waiting task for this thread, or None after counting it idle (or stopping it)."""
        with self._lock:
            if self._stopped:
                inbox.put(None)
                return None
            if not self._waiting.empty():
                return self._waiting.get()
            self._idle.append(inbox)
            return None
