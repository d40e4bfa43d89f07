"""Wake-ups after commit (spec 000 §9), across processes and within one.

The store collects what a transaction changed in a ``Notes`` and publishes it inside that
transaction: ``pg_notify`` on PostgreSQL (delivered only if it commits), and in this process
through ``transaction.on_commit``. A ``Listener`` waits for either; SQLite polls at
``OBELISK['POLL_INTERVAL']``. Notifications only say "look again": a lost or duplicated one
costs latency, never correctness. Channels (newline-separated payloads under 8000 bytes):
``obelisk_pending`` (functions with work due), ``obelisk_finished`` (ids, each with its short
return value's JSON, ``finished_item``), ``obelisk_response`` (parents that got a response;
one written by the parent's own holder stays in its process, D133), ``obelisk_cancel``,
``obelisk_timer`` and ``obelisk_scheduled`` (empty).

why: D17, D44, D45, D48, D56, D133
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from executions import conf
from executions.events import compact_json

PENDING = "obelisk_pending"
FINISHED = "obelisk_finished"
RESPONSE = "obelisk_response"
CANCEL = "obelisk_cancel"
TIMER = "obelisk_timer"
SCHEDULED = "obelisk_scheduled"
CHANNELS = (PENDING, FINISHED, RESPONSE, CANCEL, TIMER, SCHEDULED)
_MAX_PAYLOAD = 7900
# ``application_name`` of a process's LISTEN session, followed by its process id: an operator
# sees in ``pg_stat_activity`` which processes listen (a cluster: its pusher and sweep, D88).
LISTEN_APPLICATION = "obelisk-listen"
logger = logging.getLogger("obelisk.notify")


def is_postgres(using: str = "default") -> bool:
    return connections[using].vendor == "postgresql"


@dataclass
class Notes:
    """What one store operation changed, to be announced when it commits."""

    pending_ffqns: set[str] = field(default_factory=set)
    finished: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    timers: bool = False
    scheduled: bool = False
    # ``(parent id, Response)`` of the responses the operation inserts, filled in before it
    # commits: this process's listeners get them with the notification (D67).
    response_values: list = field(default_factory=list)

    def messages(self) -> list[tuple[str, str]]:
        out = []
        for channel, items in (
            (PENDING, sorted(self.pending_ffqns)),
            (FINISHED, self.finished),
            (RESPONSE, self.responses),
            (CANCEL, self.cancelled),
        ):
            out.extend((channel, chunk) for chunk in _chunks(items))
        if self.timers:
            out.append((TIMER, ""))
        if self.scheduled:
            out.append((SCHEDULED, ""))
        return out

    def publish(self, statements=None, using: str = "default") -> None:
        """Call inside the operation's transaction, after its last write. With
        ``statements`` (an ``executions.sql.Statements``) the NOTIFY joins that batch."""
        if messages := self.add_to(statements, using):
            values = self.response_values
            transaction.on_commit(lambda: deliver_locally(messages, values), using=using)

    def add_to(self, statements=None, using: str = "default") -> list[tuple[str, str]]:
        """Add the NOTIFY (PostgreSQL) to ``statements``, or run it now; returns the
        messages, for ``deliver_locally`` once the transaction has committed."""
        messages = self.messages()
        if not messages:
            return messages
        if is_postgres(using):
            placeholders = ", ".join("pg_notify(%s, %s)" for _ in messages)
            sql, params = f"SELECT {placeholders}", [part for message in messages for part in message]
            if statements is not None:
                statements.add(sql, params)
            else:
                with connections[using].cursor() as cursor:
                    cursor.execute(sql, params)
            _HUB.own_session(connections[using].connection)
        return messages


def deliver_locally(messages: list[tuple[str, str]], response_values: list | tuple = ()) -> None:
    """Wake this process's listeners for what a committed transaction announced; with the
    responses it inserted, if the store gave them (``Notes.response_values``)."""
    if messages:
        _HUB.deliver(messages, tuple(response_values))


FINISHED_VALUE_LIMIT = 1000  # characters of return-value JSON carried in a notification


def finished_item(execution_id: str, retval_json: Any) -> str:
    """An ``obelisk_finished`` item: the id, with the value's JSON if it is short."""
    text = compact_json(retval_json)
    return f"{execution_id}\t{text}" if len(text) <= FINISHED_VALUE_LIMIT else execution_id


def parse_finished_item(item: str) -> tuple[str, Any | None]:
    """``(execution id, return value JSON or None)`` of an ``obelisk_finished`` item."""
    execution_id, _, text = item.partition("\t")
    return execution_id, (json.loads(text) if text else None)


def chunk_numbers(items: list[str]) -> list[int]:
    """Which payload each item goes in: items in order, a new payload whenever the next
    item would take one over PostgreSQL's limit (about 8,000 bytes)."""
    numbers, chunk, size = [], 0, 0
    for item in items:
        if size and size + len(item) + 1 > _MAX_PAYLOAD:
            chunk, size = chunk + 1, 0
        numbers.append(chunk)
        size += len(item) + 1
    return numbers


def _chunks(items: list[str]):
    chunks: list[list[str]] = []
    for item, number in zip(items, chunk_numbers(items), strict=True):
        if number == len(chunks):
            chunks.append([])
        chunks[number].append(item)
    for chunk in chunks:
        yield "\n".join(chunk)


def sent_from(dbapi_connection) -> None:
    """A session of this process sent notifications in SQL of its own (not through
    ``Notes``): the server's echo of them is not delivered again (D45)."""
    _HUB.own_session(dbapi_connection)


class _Hub:
    """Fans notifications out to the ``Listener``s of this process.

    Commits made in this process arrive through ``deliver()`` (``transaction.on_commit``).
    On PostgreSQL one thread per process holds a connection that ``LISTEN``s on the
    channels this process's listeners asked for, and delivers what other processes commit;
    it is started by the first listener (which waits until ``LISTEN`` is in place, so
    nothing committed after it returns is missed) and restarted after a fork or a lost
    connection. The server also echoes this process's own notifications; those are dropped
    (they were delivered at commit), so a commit wakes each waiter once, not twice
    (``own_session``).

    Only the channels asked for: every notification wakes every session that listens on
    its channel, and its process, so a client waiting for results does not wake for each
    new pending execution, nor a worker for each finished one (D56). A listener that asks
    for a channel not listened on yet starts a new connection that listens on all of them
    and waits until it does; the old one ends within a second (a notification in between
    may come twice, which costs nothing: waiters re-read the tables).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._listeners: set[Listener] = set()
        self._pid = None
        self._ready = threading.Event()
        self._params: dict | None = None
        self._thread: threading.Thread | None = None
        self._channels: frozenset[str] = frozenset()  # what the current connection listens on
        self._generation = 0  # of the listening connection: an older one ends itself
        self._stopping = False
        self._own: dict[int, weakref.ref] = {}

    def subscribe(self, listener: Listener, using: str) -> None:
        with self._lock:
            self._listeners.add(listener)
        if is_postgres(using):
            self._ensure_thread(using, listener.channels)

    def own_session(self, dbapi_connection) -> None:
        """Remember a session of this process that sends notifications: the server's echo
        of them is not delivered again. Keyed by server process id; a closed session no
        longer counts (its id may be reused by another process's session)."""
        if dbapi_connection is not None:
            self._own[dbapi_connection.info.backend_pid] = weakref.ref(dbapi_connection)

    def _is_own(self, backend_pid: int) -> bool:
        ref = self._own.get(backend_pid)
        session = ref() if ref is not None else None
        return session is not None and not session.closed

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def deliver(self, messages: list[tuple[str, str]], response_values: tuple = ()) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener._deliver(messages, response_values)

    def _ensure_thread(self, using: str, channels: frozenset[str]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or we are a forked child
                self._pid = os.getpid()
                self._own = {}
                self._channels = frozenset()
                self._params = _connection_params(using)
            if not channels <= self._channels or self._thread is None:
                self._channels |= channels
                self._generation += 1
                self._ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._generation, self._channels, self._ready),
                    name="obelisk-listen",
                    daemon=True,
                )
                self._thread.start()
            ready = self._ready
        ready.wait(10)

    def _delivers(self, generation: int) -> bool:
        """A replaced session delivers until its successor listens (fewer duplicates)."""
        return generation == self._generation or not self._ready.is_set()

    def _current(self, pid: int, generation: int) -> bool:
        return pid == os.getpid() and generation == self._generation and not self._stopping

    def _run(self, generation: int, channels: frozenset[str], ready: threading.Event) -> None:
        import psycopg

        from executions.outage import Outage

        pid = self._pid
        outage = Outage(logger, "LISTEN connection")
        while self._current(pid, generation):
            try:
                conn = psycopg.connect(
                    autocommit=True, connect_timeout=5, application_name=f"{LISTEN_APPLICATION} {pid}", **self._params
                )
                for channel in sorted(channels):
                    conn.execute(f"LISTEN {channel}")
                ready.set()
                if outage.ongoing:  # whatever was committed meanwhile: waiters must look again
                    self.deliver([(channel, "") for channel in channels])
                outage.recovered()
                while self._current(pid, generation):
                    for note in conn.notifies(timeout=1.0):
                        if not self._is_own(note.pid) and self._delivers(generation):
                            self.deliver([(note.channel, note.payload)])
                conn.close()
                return
            except Exception as error:  # connection lost: listeners fall back to timed re-checks
                if not self._current(pid, generation):
                    return
                ready.set()
                time.sleep(outage.failed(error))

    def stop(self) -> None:
        """Close the LISTEN connection (at process or test-session end)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._pid = None
            self._channels = frozenset()
            self._generation += 1
        if thread is not None:
            thread.join(5)
        self._stopping = False


_HUB = _Hub()


def listening_channels() -> frozenset[str]:
    """The channels this process's LISTEN session covers (empty before the first listener)."""
    return _HUB._channels if _HUB._pid == os.getpid() else frozenset()


def stop_listening() -> None:
    """Close this process's LISTEN connection; the next ``Listener`` opens a new one."""
    _HUB.stop()


@dataclass(frozen=True)
class Notification:
    """``responses``: on ``obelisk_response`` from a commit of this process, the
    ``(parent id, Response)`` pairs it inserted, when the store gave them (D67)."""

    channel: str
    items: tuple[str, ...]
    responses: tuple = ()


class Listener:
    """A subscription to some channels; ``wait`` returns what arrived since the last call.

    Use as a context manager; subscribe *before* checking the tables, then check, then wait:
    a commit after the check always wakes the wait. Without LISTEN (SQLite), ``wait``
    returns after the poll interval at the latest, so the caller re-checks the tables.

    ``on_arrival``: instead of keeping what arrives for ``wait``, pass it to this function
    at once, in the thread that delivers it (the listening thread, or the committing one
    for a commit of this process); it must be quick and must not raise.
    """

    def __init__(self, channels: tuple[str, ...] | list[str], using: str = "default", on_arrival=None):
        self.channels = frozenset(channels)
        self.using = using
        self._on_arrival = on_arrival
        self._cond = threading.Condition()
        self._received: list[Notification] = []
        self._postgres = is_postgres(using)
        _HUB.subscribe(self, using)

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        _HUB.unsubscribe(self)

    def _deliver(self, messages: list[tuple[str, str]], response_values: tuple = ()) -> None:
        mine = [
            Notification(channel, _split(payload), response_values if channel == RESPONSE else ())
            for channel, payload in messages
            if channel in self.channels
        ]
        if mine and self._on_arrival is not None:
            self._on_arrival(mine)
        elif mine:
            with self._cond:
                self._received.extend(mine)
                self._cond.notify_all()

    def wait(self, timeout: float) -> list[Notification]:
        """Block until something arrives or ``timeout`` seconds pass; return what arrived.

        An empty list means "nothing known": the caller re-checks the tables anyway.
        """
        if not self._postgres:
            timeout = min(timeout, conf.get("POLL_INTERVAL").total_seconds())
        with self._cond:
            if not self._received and timeout > 0:
                self._cond.wait(timeout)
            received, self._received = self._received, []
        return received


def _split(payload: str) -> tuple[str, ...]:
    return tuple(item for item in payload.split("\n") if item)


def _connection_params(using: str) -> dict:
    params = connections[using].get_connection_params()
    keys = ("dbname", "user", "password", "host", "port")
    return {key: params[key] for key in keys if params.get(key)}
