"""The ports of the replay core: what the executor supplies (spec 002 §3, §4, §5.1).

A ``Writer`` appends events and creates executions in one transaction (``NewExecution`` is
one such creation); a ``Waiter`` blocks until more responses arrive (the Await strategy,
§4.2; none means Interrupt, §4.1); a ``Canceller`` cancels unawaited children and delays
while a join set closes (§5.1); a ``Lease`` is the run's lock (decision 5). The store-backed
implementations live in ``workers.replay_adapters`` (and ``workers.workflow_parking``); ``tests/support/replay_fakes.py`` has
in-memory ones.

why: D60, D77.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from executions.events import RetVal
from executions.ids import DelayId, ExecutionId


@dataclass(frozen=True)
class NewExecution:
    """An execution to create with the events that request it: a child (``parent`` set,
    §2.3) or a scheduled top-level one (``scheduled_by`` set, §2.11)."""

    execution_id: str
    ffqn: str
    params: list[Any]
    scheduled_at: datetime
    parent: tuple[str, str] | None = None
    scheduled_by: str | None = None
    component_type: str | None = None


class Writer(Protocol):
    def append(self, version: int, events: Sequence[Any], creates: Sequence[NewExecution]) -> None:
        """Write ``events`` at versions ``version, version+1, ...`` and create ``creates``, in
        one transaction (``append_batch_create_new_execution``)."""

    def stub(self, ffqn: str, target: ExecutionId, retval: RetVal) -> bool:
        """Finish ``target`` with ``retval`` and respond to its parent (§2.12 step 3). True when
        the target now holds this value (written, or already equal); False when it holds another
        (or raise ``errors.StubConflict``). ``errors.NotFound``: no such execution;
        ``errors.ValidationFailed``: its function is not ``ffqn``."""


class Waiter(Protocol):
    """Await (§4.2) waits holding the run's lock (``holds_lock``), so its join-nexts keep
    the row until the lock's expiry. A parked Interrupt run (D77) waits without it: its
    join-nexts hand the row on, as every Interrupt run's do, and it goes on only if this
    worker's next claim of the row hands it the new lock."""

    holds_lock: bool

    def wait_for_responses(self, after_seq: int) -> Sequence[Any]:
        """Block until responses with ``seq > after_seq`` exist and return them, or return
        nothing when the run must stop waiting (its lock deadline; a parked run not resumed)."""


class Canceller(Protocol):
    """Best-effort cancellation while closing a join set (§5.1); errors are ignored."""

    def cancel_activity(self, child_id: ExecutionId) -> None: ...

    def cancel_delay(self, delay_id: DelayId) -> None: ...


class Lease(Protocol):
    """The run's lock. ``extend_if_close`` runs at the start of every host call (decision 5);
    ``lock_expires_at`` is the ``run_expires_at`` of join-nexts under Await (§4.2)."""

    lock_expires_at: datetime

    def extend_if_close(self) -> None: ...
