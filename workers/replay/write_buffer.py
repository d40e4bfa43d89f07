"""Writes and their buffer (spec 002 §3.6, upstream's ``CachingDbConnection``).

``WriteBuffer`` numbers every event optimistically and writes it through the ``Writer``
port, at once or in batches; a failed write becomes ``WriteFailed``. Used by
``workers.replay.cursor``.

why: D46, D60.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workers.replay.ports import NewExecution, Writer
from workers.replay.signals import WriteFailed


class WriteBuffer:
    """Numbers every event optimistically (``next_version``) and writes it through the Writer.

    ``batch_size`` 0 writes each non-blocking event at once; N > 0 buffers them and writes the
    buffer as one transaction when it holds N events, before every blocking write, and when the
    run ends (``flush``). Buffered events are not durable; a crash loses them harmlessly, as the
    next run writes them again (§3.6, Q6)."""

    def __init__(self, writer: Writer, next_version: int, batch_size: int = 0):
        self.writer = writer
        self.next_version = next_version
        self.batch_size = batch_size
        self._first_version = next_version
        self._events: list[Any] = []
        self._creates: list[NewExecution] = []

    def non_blocking(self, event: Any, creates: Sequence[NewExecution] = ()) -> int:
        version = self.next_version
        self.next_version += 1
        if not self.batch_size:
            self._write(version, [event], creates)
            return version
        if not self._events:
            self._first_version = version
        self._events.append(event)
        self._creates.extend(creates)
        if len(self._events) >= self.batch_size:
            self.flush()
        return version

    def blocking(self, events: Sequence[Any], creates: Sequence[NewExecution] = ()) -> int:
        """Flush, then write ``events`` (a composite call) in one transaction."""
        self.flush()
        version = self.next_version
        self._write(version, events, creates)
        self.next_version += len(events)
        return version

    def flush(self) -> None:
        if not self._events:
            return
        events, creates = self._events, self._creates
        self._events, self._creates = [], []
        self._write(self._first_version, events, creates)

    def _write(self, version: int, events: Sequence[Any], creates: Sequence[NewExecution]) -> None:
        try:
            self.writer.append(version, list(events), list(creates))
        except Exception as error:
            raise WriteFailed(f"writing at version {version} failed: {error}") from error
