"""The replay cursor of one run: recorded history, matching, and the machinery of one call
(spec 002 §1.6, §3.2-§3.5, §4).

``ReplayCursor`` holds the recorded history and its processed-prefix cursor, the responses
known so far, the open join sets and the write buffer. ``process_event_by_key`` is §3.4's
matching table; ``_apply`` replays a call's keys or, once the history is exhausted, writes its
events and matches them the same way, waiting (Await) or interrupting when a join-next has
no response yet. ``workers.replay.history.EventHistory`` builds every host call on it.

why: D46, D60, D77.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from executions.events import (
    ChildExecutionRequest,
    DelayRequest,
    HistoryEventRecord,
    JoinNext,
    JoinNextTooMany,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Persist,
    Schedule,
    Stub,
)
from executions.ids import DelayId, ExecutionId, JoinSetId
from workers.replay.index import ProcessedIndex
from workers.replay.keys import (
    FFQN,
    JS,
    ChildRequestKey,
    CreateJoinSetKey,
    DelayRequestKey,
    JoinNextChildKey,
    JoinNextDelayKey,
    JoinNextKey,
    JoinNextKind,
    JoinNextTryKey,
    Key,
    PersistKey,
    ScheduleAt,
    ScheduleKey,
    StubKey,
    describe_event,
    same_fields,
    side_by_side,
)
from workers.replay.ports import Canceller, Lease, NewExecution, Waiter, Writer
from workers.replay.randomness import DeterministicRandom, decode_persisted
from workers.replay.responses import (
    ALL_PROCESSED,
    NOT_FOUND,
    PENDING,
    TRY_PENDING,
    ConsumedChild,
    ConsumedDelay,
    ResponseQueue,
)
from workers.replay.signals import (
    ConstraintViolation,
    FatalWorkflowError,
    ImportedFunctionCallError,
    NondeterminismDetected,
    WorkflowInterrupt,
    WorkflowSignal,
    WriteFailed,
)
from workers.replay.write_buffer import WriteBuffer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recorded:
    version: int
    event: Any


class ReplayCursor:
    """One run's view of a workflow execution: the recorded history and its processed-prefix
    cursor (§1.6), the responses known so far, and how one call replays or writes (§3).

    ``history``: the recorded history events, as ``(version, event)`` pairs or the store's
    records (``.version``, ``.event``; a ``HistoryEventRecord`` is unwrapped). ``next_version``:
    the version the next written event gets. ``waiter`` None is the Interrupt strategy (§4.1);
    with a waiter, blocking calls wait (Await, §4.2). ``batch_size`` buffers writes under
    either strategy (§3.6; upstream buffers only under Await, decisions.md D60).
    """

    def __init__(
        self,
        execution_id: ExecutionId | str,
        history: Iterable[Any],
        responses: Iterable[Any],
        *,
        next_version: int,
        writer: Writer,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        waiter: Waiter | None = None,
        canceller: Canceller | None = None,
        lease: Lease | None = None,
        batch_size: int = 0,
    ):
        self.execution_id = ExecutionId.parse(execution_id)
        self._events = [_recorded(item) for item in history]
        self._recorded_count = len(self._events)
        self._cursor = 0
        self._index = ProcessedIndex(self.execution_id)
        self._queue = ResponseQueue()
        self._queue.add(responses)
        self._open: dict[str, dict[str, str]] = {}  # open join set -> unawaited id -> component type
        self._buffer = WriteBuffer(writer, next_version, batch_size)
        self._writer = writer
        self._clock = clock
        self._waiter = waiter
        self._canceller = canceller
        self._lease = lease
        self._rng = DeterministicRandom(self.execution_id.random_seed())
        self._poison: WorkflowSignal | None = None
        self._patches: dict[str, bool] = {}  # change id -> the path this run takes (``patched``)

    # -- state ------------------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        """Recorded events remain unprocessed: logs are demoted (§2.15)."""
        return self._cursor < len(self._events)

    @property
    def position(self) -> int:
        """How many events (recorded or new) have been processed: the cursor (§1.6)."""
        return self._cursor

    @property
    def poisoned(self) -> WorkflowSignal | None:
        return self._poison

    @property
    def next_version(self) -> int:
        return self._buffer.next_version

    def open_join_sets(self) -> dict[str, list[str]]:
        """Open join sets in creation order, with their unawaited ids in submission order."""
        return {js: list(unawaited) for js, unawaited in self._open.items()}

    def reserve_versions(self, count: int) -> None:
        """The executor wrote ``count`` events of its own at ``next_version`` (a ``Locked``
        by the same run that keeps a resolved wait's run going, spec 000 §10, after a
        ``flush``): later writes come after them."""
        self._buffer.flush()
        self._buffer.next_version += count

    def add_responses(self, responses: Iterable[Any]) -> None:
        """Responses that arrived after the history was loaded (the Await loop, §4.2)."""
        self._queue.add(responses)

    def refused(self, error: FatalWorkflowError) -> WorkflowSignal:
        """A host call the context refused before it reached the history (a function that is
        not registered, arguments that do not fit, D98): what to raise. It poisons the
        history as a fatal error of the history's own does (§8.1), so the run fails at once;
        after an earlier signal, that one (the first is kept)."""
        if self._poison is None:
            self._poison = error
        return self._poison

    def flush(self) -> None:
        """Write buffered events (§3.6); the end of every run flushes (``finalize``)."""
        with self._host_call(extend=False):
            self._buffer.flush()

    # -- §3.4: the matching table -------------------------------------------------------------

    def process_event_by_key(self, key: Key) -> Any:
        """Match ``key`` against the first unprocessed event (§3.4). Returns ``NOT_FOUND`` when
        there is none, ``PENDING`` for a join-next whose response is not known yet, otherwise
        the outcome; any other pair is ``NondeterminismDetected`` (§3.7)."""
        if self._cursor == len(self._events):
            return NOT_FOUND
        event = self._events[self._cursor].event
        match key, event:
            case CreateJoinSetKey(), JoinSetCreate() if same_fields(key, event, JS):
                return self._advance(JoinSetId.parse(event.join_set_id))
            case PersistKey(), Persist() if key.matches(event):
                return self._advance(decode_persisted(event))
            case ChildRequestKey(), JoinSetRequest(request=ChildExecutionRequest()) if key.matches(event):
                return self._advance(ExecutionId.parse(event.request.child_execution_id))
            case DelayRequestKey(), JoinSetRequest(request=DelayRequest()) if key.matches(event):
                return self._advance(DelayId.parse(event.request.delay_id))
            case JoinNextChildKey(kind=JoinNextKind.AWAIT_NEXT), JoinNextTooMany() if same_fields(key, event, JS, FFQN):
                return self._advance(ALL_PROCESSED)
            case JoinNextChildKey(), JoinNext(closing=False) if same_fields(key, event, JS, FFQN):
                return self._consume(event.join_set_id)
            case JoinNextDelayKey(), JoinNext(requested_ffqn=None, closing=False) if same_fields(key, event, JS):
                return self._consume(event.join_set_id)
            case JoinNextKey(), JoinNext(requested_ffqn=None) if same_fields(key, event, JS, "closing"):
                return self._consume(event.join_set_id)
            case JoinNextKey(closing=False), JoinNextTooMany(requested_ffqn=None) if same_fields(key, event, JS):
                return self._advance(ALL_PROCESSED)
            case JoinNextTryKey(), JoinNextTry() if same_fields(key, event, JS):
                return self._replay_try(event)
            case ScheduleKey(), Schedule() if key.matches(event):
                return self._advance(ExecutionId.parse(event.execution_id))
            case StubKey(), Stub() if same_fields(key, event, "target_execution_id", "retval_hash"):
                return self._advance(event.result == {"Ok": None})
        raise self._mismatch(key)

    def _advance(self, outcome: Any) -> Any:
        """Mark the event at the cursor processed: it now counts for ids and decisions."""
        self._index.record(self._events[self._cursor].event)
        self._cursor += 1
        return outcome

    def _consume(self, join_set_id: str) -> Any:
        """Peek (§3.4): the first unconsumed response of the join set resolves the join-next at
        the cursor; without one nothing is marked and the result is ``PENDING``."""
        response = self._queue.peek(join_set_id)
        if response is None:
            if self._cursor < self._recorded_count:  # decision 2: upstream panics here
                log.warning(
                    "%s: recorded %s at version %d has no loaded response; waiting or interrupting",
                    self.execution_id,
                    describe_event(self._events[self._cursor].event),
                    self._events[self._cursor].version,
                )
            return PENDING
        self._queue.pop(join_set_id)
        return self._advance(self._outcome_of(response))

    def _outcome_of(self, response: Any) -> ConsumedChild | ConsumedDelay:
        if response.child_execution_id is not None:
            child = response.child_execution_id
            return ConsumedChild(ExecutionId.parse(child), self._index.child_ffqn[child], response.child_retval)
        expires_at = self._index.delay_expires_at[response.delay_id]
        return ConsumedDelay(DelayId.parse(response.delay_id), bool(response.delay_success), expires_at)

    def _replay_try(self, event: JoinNextTry) -> Any:
        if event.outcome == "found":
            return self._consume(event.join_set_id)
        return self._advance(ALL_PROCESSED if event.outcome == "all_processed" else TRY_PENDING)

    def _mismatch(self, key: Key) -> NondeterminismDetected:
        entry = self._events[self._cursor]
        return NondeterminismDetected(
            f"key does not match event stored at version {entry.version}: key: {key}, "
            f"event: {describe_event(entry.event)}\n"
            f"  position: event {self._cursor + 1} of {len(self._events)} in the history, version {entry.version}\n"
            + side_by_side(key, entry.event)
        )

    # -- §3.2, §3.3, §3.5: one call --------------------------------------------------------------

    @contextmanager
    def _host_call(self, extend: bool = True) -> Iterator[None]:
        """Every host call: refuse after a signal (poison), extend the lock if it is close to
        expiry (decision 5), and poison on the first signal raised (§8.1)."""
        if self._poison is not None:
            raise self._poison
        try:
            if extend and self._lease is not None:
                self._extend_lease()
            yield
        except WorkflowSignal as signal:
            self._poison = signal
            raise

    def _extend_lease(self) -> None:
        try:
            self._lease.extend_if_close()
        except Exception as error:
            raise WriteFailed(f"extending the lock failed: {error}") from error

    def _apply(self, keys: list[Key], write: Callable[[], None]) -> Any:
        """Replay the call's keys; when the history is exhausted, ``write`` its events and
        match them the same way (§3.2); a join-next without its response waits (§3.5)."""
        outcome = self._replay_keys(keys)
        if outcome is NOT_FOUND:
            write()
            outcome = self._replay_keys(keys)
            assert outcome is not NOT_FOUND, "a written event must match its own key"
        if outcome is PENDING:
            outcome = self._wait_for(keys[-1])
        return outcome

    def _replay_keys(self, keys: list[Key]) -> Any:
        """``find_matching_atomic`` (§3.3): all keys of a call match, or none (history exhausted)."""
        outcome = NOT_FOUND
        for position, key in enumerate(keys):
            outcome = self.process_event_by_key(key)
            if outcome is NOT_FOUND and position > 0:
                raise NondeterminismDetected(f"the history ends inside a one-off call: key: {key} has no event")
            if outcome is NOT_FOUND:
                return NOT_FOUND
        return outcome

    def _wait_for(self, key: Key) -> Any:
        """No response yet for the join-next at the cursor: under Await, wait for more
        responses and try again; under Interrupt, or when the wait ends, interrupt (§4)."""
        self._buffer.flush()
        while self._waiter is not None:
            arrived = self._waiter.wait_for_responses(self._queue.last_seq)
            if not arrived:
                break
            self._queue.add(arrived)
            outcome = self.process_event_by_key(key)
            if outcome is not PENDING:
                return outcome
        raise WorkflowInterrupt(f"waiting for a response in join set `{key.join_set_id}`")

    def _record(self, version: int, events: Sequence[Any]) -> None:
        """Newly written events join the history unprocessed, to be matched by their keys."""
        self._events.extend(Recorded(version + offset, event) for offset, event in enumerate(events))

    def _write_non_blocking(self, event: Any, creates: Sequence[NewExecution] = ()) -> None:
        self._record(self._buffer.non_blocking(event, creates), [event])

    def _write_blocking(self, events: Sequence[Any], creates: Sequence[NewExecution] = ()) -> None:
        self._record(self._buffer.blocking(events, creates), events)

    def _run_expires_at(self, join_set_id: str | None = None) -> datetime:
        """``JoinNext.run_expires_at``: now under Interrupt, the lock's expiry under Await (§4).

        Also the lock's expiry under Interrupt when this run already holds the response it
        is about to consume (``join_set_id``'s next one is loaded): the run goes on, so the
        row must stay this run's until its lock expires. With ``now``, the store would make
        it pending at once and another worker, woken by the notification, would take it
        over mid-run (fenced out, but at the price of a full replay per response)."""
        holds_lock = self._waiter is not None and self._waiter.holds_lock
        if self._lease is not None and (
            holds_lock or (join_set_id is not None and self._queue.peek(join_set_id) is not None)
        ):
            return self._lease.lock_expires_at
        return self._clock()

    def _require_open(self, join_set: JoinSetId | str) -> str:
        """Decision 2 (Q1): checked before anything is written."""
        join_set_id = str(join_set)
        if join_set_id not in self._open:
            raise ConstraintViolation(f"not found in open join sets: `{join_set_id}`")
        return join_set_id

    def _mark_awaited(self, join_set_id: str, outcome: ConsumedChild | ConsumedDelay) -> None:
        self._open.get(join_set_id, {}).pop(str(outcome.response_id), None)

    def _expiry(self, schedule_at: ScheduleAt, ffqn: str) -> datetime:
        try:
            return schedule_at.as_datetime(self._clock())
        except OverflowError:
            raise ImportedFunctionCallError(ffqn, "schedule-at conversion error") from None


def _recorded(item: Any) -> Recorded:
    version, event = item if isinstance(item, tuple) else (item.version, item.event)
    if isinstance(event, HistoryEventRecord):
        event = event.event
    return Recorded(version, event)
