"""Every host call of a workflow as replay-or-write (spec 002 §2), and the end of a run (§5).

``EventHistory`` is what ``workers.workflow.WorkflowContext`` calls: join sets (§2.1, §2.2),
submissions (§2.3, §2.4), join-next and its variants (§2.5, §2.6, decision 9), ``get``
(§2.7), the one-off blocking calls (§2.8-§2.10), schedule and stub (§2.11, §2.12), random
values and a durable now (§2.13, decision 4), closing a join set (§5.1) and ``finalize``
(§5.2, §5.3). Each call builds its keys and hands them to ``ReplayCursor._apply``
(``workers.replay.cursor``) with the events to write when the history is exhausted.

why: D46, D60, D98.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from executions import errors
from executions.events import (
    ACTIVITY_TYPES,
    ChildExecutionRequest,
    DelayRequest,
    JoinNext,
    JoinNextTooMany,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Persist,
    RetVal,
    Stub,
    retval_from_json,
)
from executions.ids import DelayId, ExecutionId, FunctionFqn, JoinSetId
from workers.replay.cursor import ReplayCursor
from workers.replay.keys import (
    ChildRequestKey,
    CreateJoinSetKey,
    DelayRequestKey,
    JoinNextChildKey,
    JoinNextDelayKey,
    JoinNextKey,
    JoinNextKind,
    JoinNextTryKey,
    PersistKey,
    ScheduleAt,
    ScheduleKey,
    StubKey,
    describe_event,
    retval_hash,
    schedule_event,
)
from workers.replay.ports import NewExecution
from workers.replay.randomness import NOW_KIND, U64_MAX
from workers.replay.responses import ALL_PROCESSED, DELAY, TRY_PENDING, ConsumedDelay
from workers.replay.signals import (
    AllProcessed,
    ChildFailed,
    ConstraintViolation,
    DelayCancelled,
    FatalWorkflowError,
    FunctionMismatch,
    ImportedFunctionCallError,
    NondeterminismDetected,
    NotFoundInProcessedResponses,
    StubConflict,
    WriteFailed,
)

log = logging.getLogger(__name__)


class EventHistory(ReplayCursor):
    """One run's view of a workflow execution (see ``ReplayCursor`` for the arguments) with
    every host call (§2) as replay-or-write and the end of the run (§5)."""

    # -- §2.1, §2.2: join sets --------------------------------------------------------------------

    def create_join_set(self, name: str | None = None) -> JoinSetId:
        """``g:<N>``, or ``n:<name>`` (``InvalidJoinSetName``/``JoinSetConflict``, nothing recorded)."""
        with self._host_call():
            join_set = self._index.generated_join_set() if name is None else self._index.named_join_set(name)
            key = CreateJoinSetKey(str(join_set))
            created = self._apply([key], lambda: self._write_non_blocking(JoinSetCreate(join_set_id=str(join_set))))
            self._open[str(created)] = {}
            return created

    # -- §2.3, §2.4: submissions ------------------------------------------------------------------

    def submit(
        self, join_set: JoinSetId | str, ffqn: str, params: Sequence[Any], component_type: str = "activity"
    ) -> ExecutionId:
        """Start a child in the join set; ``component_type`` decides what closing does (§5.1)."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            ffqn = str(FunctionFqn.parse(ffqn))
            child_id = self._index.child_id(JoinSetId.parse(join_set_id))
            key = ChildRequestKey(join_set_id, str(child_id), ffqn, tuple(params))
            child_id = self._apply([key], lambda: self._write_child_request(key, component_type))
            self._open[join_set_id][str(child_id)] = component_type
            return child_id

    def _write_child_request(self, key: ChildRequestKey, component_type: str) -> None:
        request = ChildExecutionRequest(child_execution_id=key.child_id, target_ffqn=key.ffqn, params=list(key.params))
        event = JoinSetRequest(join_set_id=key.join_set_id, request=request)
        self._write_non_blocking(event, [self._child_create(key, component_type)])

    def _child_create(self, key: ChildRequestKey, component_type: str) -> NewExecution:
        parent = (str(self.execution_id), key.join_set_id)
        return NewExecution(key.child_id, key.ffqn, list(key.params), self._clock(), parent, None, component_type)

    def submit_delay(self, join_set: JoinSetId | str, schedule_at: Any) -> DelayId:
        """A durable timer in the join set; its response is ok when it fires (§2.4)."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            at = ScheduleAt.of(schedule_at)
            delay_id = self._index.delay_id(JoinSetId.parse(join_set_id))
            key = DelayRequestKey(join_set_id, str(delay_id), at)
            expires_at = self._expiry(at, "submit-delay")
            delay_id = self._apply([key], lambda: self._write_non_blocking(_delay_request(key, expires_at)))
            self._open[join_set_id][str(delay_id)] = DELAY
            return delay_id

    # -- §2.5, §2.6, decision 9: join-next ----------------------------------------------------------

    def join_next(self, join_set: JoinSetId | str) -> tuple[ExecutionId | DelayId, bool]:
        """The next response of the join set: ``(id, ok)``; ``AllProcessed`` when nothing is
        left to await (a ``JoinNextTooMany``, which never blocks)."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            key = JoinNextKey(join_set_id)
            outcome = self._apply([key], lambda: self._write_join_next(join_set_id, None))
            if outcome is ALL_PROCESSED:
                raise AllProcessed(join_set_id)
            self._mark_awaited(join_set_id, outcome)
            return outcome.response_id, outcome.ok

    def await_next(self, join_set: JoinSetId | str, ffqn: str) -> tuple[ExecutionId, RetVal]:
        """The next response, which must be a child of ``ffqn`` (§2.6). Otherwise the response
        is consumed all the same and ``FunctionMismatch`` says what it was."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            ffqn = str(FunctionFqn.parse(ffqn))
            key = JoinNextChildKey(join_set_id, JoinNextKind.AWAIT_NEXT, ffqn)
            outcome = self._apply([key], lambda: self._write_join_next(join_set_id, ffqn))
            if outcome is ALL_PROCESSED:
                raise AllProcessed(join_set_id)
            self._mark_awaited(join_set_id, outcome)
            if isinstance(outcome, ConsumedDelay):
                raise FunctionMismatch(ffqn, None, outcome.delay_id)
            if outcome.ffqn != ffqn:
                raise FunctionMismatch(ffqn, outcome.ffqn, outcome.child_id)
            return outcome.child_id, outcome.retval

    def _write_join_next(self, join_set_id: str, ffqn: str | None) -> None:
        """§2.5 step 2: a ``JoinNext`` while submissions exceed consumed responses, else
        ``JoinNextTooMany``; decided from processed counts only (§7 inv. 6)."""
        if self._index.submissions(join_set_id) > self._index.consumed(join_set_id):
            event = JoinNext(
                join_set_id=join_set_id, run_expires_at=self._run_expires_at(join_set_id), requested_ffqn=ffqn
            )
        else:
            event = JoinNextTooMany(join_set_id=join_set_id, requested_ffqn=ffqn)
        if isinstance(event, JoinNext) and self._queue.peek(join_set_id) is not None:
            # The response it takes is in hand: it cannot block, so under a buffer it is
            # buffered like a cacheable event (decisions.md D46; upstream writes it at once).
            # Lost in a crash, it is written again by the replay, which finds the same
            # response, since responses are only ever appended.
            self._write_non_blocking(event)
        else:
            self._write_blocking([event])

    def try_join_next(self, join_set: JoinSetId | str) -> tuple[ExecutionId | DelayId, bool] | None:
        """Decision 9: like ``join_next`` without blocking; None when no response is there yet.
        A found response is consumed; the recorded outcome is replayed whatever arrived since."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            key = JoinNextTryKey(join_set_id)
            outcome = self._apply([key], lambda: self._write_join_next_try(join_set_id))
            if outcome is ALL_PROCESSED:
                raise AllProcessed(join_set_id)
            if outcome is TRY_PENDING:
                return None
            self._mark_awaited(join_set_id, outcome)
            return outcome.response_id, outcome.ok

    def _write_join_next_try(self, join_set_id: str) -> None:
        if self._index.submissions(join_set_id) <= self._index.consumed(join_set_id):
            outcome = "all_processed"
        else:
            outcome = "found" if self._queue.peek(join_set_id) is not None else "pending"
        self._write_non_blocking(JoinNextTry(join_set_id=join_set_id, outcome=outcome))

    # -- §2.7: get ---------------------------------------------------------------------------

    def get(self, ffqn: str, child_id: ExecutionId | str) -> RetVal:
        """The value of a child whose response was consumed; never writes, never blocks, no key.
        Checks in order: known and consumed (else not found), then the function (§2.7)."""
        with self._host_call():
            child = ExecutionId.parse(child_id)
            if child.is_top_level:
                raise ImportedFunctionCallError(ffqn, f"`{child}` is not a child execution id")
            known_ffqn = self._index.child_ffqn.get(str(child))
            response = self._queue.consumed_child(str(child))
            if known_ffqn is None or response is None:
                raise NotFoundInProcessedResponses(child)
            if known_ffqn != str(FunctionFqn.parse(ffqn)):
                raise FunctionMismatch(str(ffqn), known_ffqn, child)
            return response.child_retval

    # -- §2.8, §2.9, §2.10: one-off blocking calls ----------------------------------------------

    def call(self, ffqn: str, params: Sequence[Any], component_type: str = "activity") -> Any:
        """Direct call: the child's ok value, or ``ChildFailed`` with its error or failure."""
        child_id, retval = self._one_off_child(FunctionFqn.parse(ffqn).function, ffqn, params, component_type)
        if isinstance(retval, Ok):
            return retval.value
        raise ChildFailed(child_id, retval)

    def invoke(
        self, label: str, ffqn: str, params: Sequence[Any], component_type: str = "activity"
    ) -> tuple[ExecutionId, RetVal]:
        """``-invoke``: a direct call in ``o:<N>-<label>``; an invalid label records nothing."""
        return self._one_off_child(label, ffqn, params, component_type)

    def _one_off_child(
        self, suffix: str, ffqn: str, params: Sequence[Any], component_type: str
    ) -> tuple[ExecutionId, RetVal]:
        """Three events and the child's creation in one transaction, after a flush (§2.8)."""
        with self._host_call():
            ffqn = str(FunctionFqn.parse(ffqn))
            join_set = self._index.one_off_join_set(suffix)
            request = ChildRequestKey(str(join_set), str(self.execution_id.child(join_set, 1)), ffqn, tuple(params))
            keys = [
                CreateJoinSetKey(str(join_set)),
                request,
                JoinNextChildKey(str(join_set), JoinNextKind.DIRECT_CALL, ffqn),
            ]

            def write() -> None:
                child = ChildExecutionRequest(
                    child_execution_id=request.child_id, target_ffqn=ffqn, params=list(request.params)
                )
                events = [
                    JoinSetCreate(join_set_id=str(join_set)),
                    JoinSetRequest(join_set_id=str(join_set), request=child),
                    JoinNext(join_set_id=str(join_set), run_expires_at=self._run_expires_at(), requested_ffqn=ffqn),
                ]
                self._write_blocking(events, [self._child_create(request, component_type)])

            outcome = self._apply(keys, write)
            return outcome.child_id, outcome.retval

    def sleep(self, schedule_at: Any) -> datetime:
        """A one-off delay ``o:<N>-sleep`` (id ``…_1``). Returns the *recorded* expiry, also on
        replay; ``DelayCancelled`` when the delay was cancelled (§2.10)."""
        with self._host_call():
            at = ScheduleAt.of(schedule_at)
            join_set = self._index.one_off_join_set("sleep")
            key = DelayRequestKey(str(join_set), str(DelayId(self.execution_id, join_set, 1)), at)
            expires_at = self._expiry(at, "sleep")
            keys = [CreateJoinSetKey(str(join_set)), key, JoinNextDelayKey(str(join_set))]

            def write() -> None:
                events = [
                    JoinSetCreate(join_set_id=str(join_set)),
                    _delay_request(key, expires_at),
                    JoinNext(join_set_id=str(join_set), run_expires_at=self._run_expires_at()),
                ]
                self._write_blocking(events)

            outcome = self._apply(keys, write)
            if not isinstance(outcome, ConsumedDelay):
                raise ConstraintViolation(f"a child responded in the sleep join set `{join_set}`")
            if not outcome.fired:
                raise DelayCancelled(outcome.delay_id)
            return outcome.expires_at

    # -- §2.11, §2.12: schedule and stub ----------------------------------------------------------

    def schedule(self, ffqn: str, params: Sequence[Any], schedule_at: Any = None) -> ExecutionId:
        """Start a new top-level execution (no parent, no response). Its id takes this
        execution's ULID timestamp and 80 bits drawn from the run's RNG (§1.2)."""
        with self._host_call():
            ffqn = str(FunctionFqn.parse(ffqn))
            at = ScheduleAt.of(schedule_at)
            new_id = ExecutionId(self.execution_id.ulid[:10] + self._rng.ulid_randomness())
            key = ScheduleKey(str(new_id), at, ffqn, tuple(params))
            scheduled_at = self._expiry(at, ffqn)
            create = NewExecution(str(new_id), ffqn, list(params), scheduled_at, None, str(self.execution_id))
            return self._apply([key], lambda: self._write_non_blocking(schedule_event(key), [create]))

    def stub(self, ffqn: str, target: ExecutionId | str, retval: Any) -> None:
        """Set the result of a derived execution (normally an activity stub). ``StubConflict``
        when it already holds another value. Not cacheable: the buffer is flushed first, since
        the target may be this run's own buffered child (§2.12)."""
        with self._host_call():
            target_id = ExecutionId.parse(target)
            if target_id.is_top_level:
                raise ImportedFunctionCallError(ffqn, f"`{target_id}` is a top-level execution; it cannot be stubbed")
            value = retval_from_json(retval)
            key = StubKey(str(target_id), retval_hash(value))

            def write() -> None:
                self._buffer.flush()
                held = self._stub_target(ffqn, target_id, value)
                result = {"Ok": None} if held else {"Err": "conflict"}
                event = Stub(target_execution_id=key.target_execution_id, retval_hash=key.retval_hash, result=result)
                self._write_blocking([event])

            if not self._apply([key], write):
                raise StubConflict(target_id)

    def _stub_target(self, ffqn: str, target: ExecutionId, retval: RetVal) -> bool:
        """Decision 2: an unknown target or another function is fatal, not retried forever."""
        try:
            return self._writer.stub(ffqn, target, retval)
        except errors.StubConflict:
            return False
        except errors.NotFound:
            raise ImportedFunctionCallError(ffqn, f"execution `{target}` not found") from None
        except errors.ValidationFailed as error:
            raise ImportedFunctionCallError(ffqn, str(error)) from None
        except Exception as error:
            raise WriteFailed(f"stubbing `{target}` failed: {error}") from error

    # -- §2.13, decision 4: random values and a durable now ----------------------------------------

    def random_u64(self, low: int, high_exclusive: int) -> int:
        """Uniform in ``[low, high_exclusive)`` (Q10 fixed: upstream also draws ``high_exclusive``)."""
        _check_u64_range(low, high_exclusive - 1, high_exclusive)
        return self._random_u64(low, high_exclusive - 1)

    def random_u64_inclusive(self, low: int, high_inclusive: int) -> int:
        _check_u64_range(low, high_inclusive, high_inclusive)
        return self._random_u64(low, high_inclusive)

    def _random_u64(self, low: int, high: int) -> int:
        with self._host_call():
            value = self._rng.between(low, high)
            key = PersistKey({"type": "random_u64", "min": low, "max_inclusive": high}, value.to_bytes(8, "big"))
            return self._apply([key], lambda: self._write_persist(key))

    def random_string(self, min_length: int, max_length_exclusive: int) -> str:
        """Alphanumeric, ``min_length <= len < max_length_exclusive`` (Q10 fixed: upstream
        emits one character more than the length it drew)."""
        if not 0 <= min_length < max_length_exclusive:
            raise ValueError(f"empty length range [{min_length}, {max_length_exclusive})")
        with self._host_call():
            value = self._rng.text(self._rng.between(min_length, max_length_exclusive - 1))
            kind = {"type": "random_string", "min_length": min_length, "max_length_exclusive": max_length_exclusive}
            key = PersistKey(kind, value.encode())
            return self._apply([key], lambda: self._write_persist(key))

    def now(self) -> datetime:
        """Durable time (decision 4): the clock on the first run, the recorded value after."""
        with self._host_call():
            key = PersistKey(NOW_KIND, None)
            return self._apply([key], lambda: self._write_persist(key, self._clock().isoformat().encode()))

    def patched(self, change_id: str) -> bool:
        """Temporal's ``patched()``: True where this run takes the new code path. A history
        recorded before the patch (its next event is not this change's marker) replays the
        old path: False, and nothing is consumed. Past the history the marker is written
        (a ``Persist`` of kind ``patch``) and the answer is True. A run keeps its first answer
        for a change id, so every call of it takes one path (D112)."""
        with self._host_call():
            if change_id in self._patches:
                return self._patches[change_id]
            key = PersistKey({"type": "patch", "change_id": change_id}, b"")
            upcoming = self._events[self._cursor].event if self.is_replaying else None
            taken = upcoming is None or (isinstance(upcoming, Persist) and key.matches(upcoming))
            if taken:
                self._apply([key], lambda: self._write_persist(key))
            self._patches[change_id] = taken
            return taken

    def _write_persist(self, key: PersistKey, value: bytes | None = None) -> None:
        raw = key.value if value is None else value
        self._write_non_blocking(Persist(value=list(raw), kind=key.kind))

    # -- §5.1: closing a join set -------------------------------------------------------------

    def close_join_set(self, join_set: JoinSetId | str) -> None:
        """Cancel the unawaited activities and delays, newest first; then consume one response
        per unawaited request with closing join-nexts, so child workflows are awaited (§5.1)."""
        with self._host_call():
            self._close(self._require_open(join_set))

    def _close(self, join_set_id: str) -> None:
        unawaited = self._open.pop(join_set_id)
        self._buffer.flush()  # the cancellations must reach buffered children and delays
        self._cancel(unawaited)
        for _ in unawaited:
            key = JoinNextKey(join_set_id, closing=True)
            self._apply([key], lambda: self._write_closing_join_next(join_set_id))

    def _write_closing_join_next(self, join_set_id: str) -> None:
        expires = self._run_expires_at(join_set_id)
        self._write_blocking([JoinNext(join_set_id=join_set_id, run_expires_at=expires, closing=True)])

    def _cancel(self, unawaited: dict[str, str]) -> None:
        """Best effort and idempotent, redone on every replay, never recorded (§5.1 step 3)."""
        if self._canceller is None:
            return
        for response_id, component_type in reversed(list(unawaited.items())):
            try:
                if component_type == DELAY:
                    self._canceller.cancel_delay(DelayId.parse(response_id))
                elif component_type in ACTIVITY_TYPES:
                    self._canceller.cancel_activity(ExecutionId.parse(response_id))
            except Exception:
                log.warning("%s: cancelling %s failed; ignored", self.execution_id, response_id, exc_info=True)

    # -- §5.2, §5.3: the end of the function ----------------------------------------------------

    def finalize(self) -> None:
        """Call when the workflow function has returned or raised (a trap). Flushes, then:

        - after an interrupt or a failed write: raises it again, closing nothing (§5.3);
        - after a fatal error: cancels the unawaited activities and delays of every open join
          set (no closing join-nexts: the history is inconsistent) and raises the *first* fatal
          error (decision 2, Q4);
        - otherwise (returned, or trapped: decision 3) closes the open join sets that have
          unawaited requests, newest first, then raises ``NondeterminismDetected`` if a recorded
          event was left unprocessed (§5.2). Closing may wait, or interrupt.
        """
        if not isinstance(self._poison, WriteFailed):
            try:
                self._buffer.flush()
            except WriteFailed as error:
                self._poison = self._poison or error
        if isinstance(self._poison, FatalWorkflowError):
            for unawaited in reversed(list(self._open.values())):
                self._cancel(unawaited)
        if self._poison is not None:
            raise self._poison
        with self._host_call():
            while (join_set_id := self._last_open_with_unawaited()) is not None:
                self._close(join_set_id)
            self._check_all_processed()

    def _last_open_with_unawaited(self) -> str | None:
        return next((js for js, unawaited in reversed(self._open.items()) if unawaited), None)

    def _check_all_processed(self) -> None:
        if self._cursor < len(self._events):
            entry = self._events[self._cursor]
            raise NondeterminismDetected(
                f"found unprocessed request stored at version {entry.version}: event: {describe_event(entry.event)}"
            )


def _delay_request(key: DelayRequestKey, expires_at: datetime) -> JoinSetRequest:
    request = DelayRequest(delay_id=key.delay_id, expires_at=expires_at, schedule_at=key.schedule_at.to_json())
    return JoinSetRequest(join_set_id=key.join_set_id, request=request)


def _check_u64_range(low: int, high: int, bound: int) -> None:
    if not (0 <= low <= high <= U64_MAX):
        raise ValueError(f"empty or out-of-range u64 range: min {low}, bound {bound}")
