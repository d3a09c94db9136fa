"""A producer's events built in a thread, a bounded number of windows ahead of the consumer (and,
with every item counted as a window, a rank's batches received ahead of the trainer: loader.py).

The next shuffle window is read, decoded and cut while the current one's batches go out, so that
a loader worker's lead at a window boundary is a window, not the DataLoader's two batches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """Runs `events` in a thread, at most `windows` windows beyond the one being handed out
    (`is_window` tells which events are windows; the others take no room). The events come out
    in order; an error in the thread is raised where they are taken; `close` ends the thread."""

    def __init__(self, events: Iterator[T], windows: int, is_window: Callable[[T], bool]) -> None:
        self._events = events
        self._is_window = is_window
        # the window being handed out, and `windows` more built ahead of it
        self._room = threading.Semaphore(windows + 1)
        self._queue: queue.SimpleQueue[tuple[T | None, BaseException | None]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="read-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                while not self._room.acquire(timeout=0.1):  # a window handed out frees room
                    if self._stop.is_set():
                        return
                event = next(self._events, None)
                while event is not None and not self._is_window(event):
                    self._queue.put((event, None))
                    event = next(self._events, None)
                self._queue.put((event, None))
                if event is None:
                    return
        except BaseException as exc:
            self._queue.put((None, exc))

    def __iter__(self) -> Iterator[T]:
        while True:
            event, error = self._queue.get()
            if error is not None:
                raise error
            if event is None:
                return
            yield event
            if self._is_window(event):
                self._room.release()  # its batches are out: the thread may build one more

    def close(self, join_s: float = 0.0) -> None:
        """Stop the thread; with `join_s`, wait that long for it to end (it ends at its next
        check, or once the item it is taking arrives)."""
        self._stop.set()
        if join_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(join_s)
