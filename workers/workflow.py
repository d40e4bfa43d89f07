"""The authoring API of workflows: ``@workflow`` and the ``WorkflowContext`` it receives.

::

    from datetime import timedelta
    from workers import workflow

    @workflow
    def order(ctx, customer: str, items: list[str]) -> dict:
        with ctx.join_set() as js:                      # structured concurrency
            for item in items:
                js.submit(reserve, customer, item)      # activities (or child workflows)
            reserved = [js.await_next(reserve)[1] for _ in items]
        ctx.sleep(timedelta(minutes=5))                 # a durable timer
        receipt = ctx.call(charge, customer, len(items))  # submit and wait for one child
        return {"reserved": reserved, "receipt": receipt}

A workflow is a plain function replayed from its event log after any crash or restart
(spec 002): every call on ``ctx`` is recorded on the first run and answered from the log on
the next. So a workflow must be deterministic: the same calls in the same order with the
same arguments. Side effects belong in activities; time and randomness come from ``ctx``
(``ctx.now()``, ``ctx.random_u64()``, ``ctx.random_string()``, ``ctx.uuid()``), and the
standard ones raise inside workflow code (``workers.determinism``).

This module imports no worker runtime and no Django. The runtime (``workers.workflow_runner``)
builds the context around one run's ``replay.EventHistory``.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import uuid as _uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from executions.events import Err, ExecutionFailure, Ok, RetVal
from workers import determinism
from workers.registry import ArgumentError, Function, build, check_target, lookup, register
from workers.replay import (
    AllProcessed,
    ChildFailed,
    DelayCancelled,
    EventHistory,
    FunctionMismatch,
    ImportedFunctionCallError,
    InvalidJoinSetName,
    JoinSetConflict,
    NotFoundInProcessedResponses,
    StubConflict,
    WorkflowError,
    WorkflowSignal,
)

__all__ = [
    "AllProcessed",
    "ChildFailed",
    "DelayCancelled",
    "FunctionMismatch",
    "InvalidJoinSetName",
    "JoinSet",
    "JoinSetConflict",
    "NotFoundInProcessedResponses",
    "StubConflict",
    "WorkflowContext",
    "WorkflowError",
    "workflow",
]

DEFAULT_WORKFLOW_LOCK = timedelta(seconds=30)
NO_TIMEOUT = timedelta(days=365)  # a workflow run is bounded by its lock, not a timeout
logger = logging.getLogger("obelisk.workflow")

FunctionRef = Function | str


def workflow(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    blocking: str = "await",
    lock_duration: timedelta = DEFAULT_WORKFLOW_LOCK,
):
    """Register ``fn(ctx, *args)`` as a workflow; usable bare (``@workflow``) or with options.

    ``blocking``: ``"await"`` (the default, decision 10) keeps a run waiting in place for a
    child's or timer's response until its lock's deadline; ``"interrupt"`` ends the run at
    every wait, and the response starts a new run that replays, unless the run, parked in its
    worker meanwhile, goes on there (D77). Both give the same results.
    Workflows are retried without limit after a lost worker, never after their own failure.
    """

    def decorate(target: Callable) -> Function:
        spec = build(
            target, name, None, timedelta(0), NO_TIMEOUT, lock_duration, component_type="workflow", blocking=blocking
        )
        module = sys.modules.get(target.__module__)
        if module is not None:
            determinism.guard_module(module)
        return register(spec)

    check_target(fn, "@workflow")
    return decorate(fn) if fn is not None else decorate


class WorkflowContext:
    """What a running workflow can do: every method is a recorded, replayed host call."""

    def __init__(self, history: EventHistory, execution_id: str):
        self._history = history
        self.execution_id = execution_id
        self.log = _ReplayAwareLogger(logger, history, execution_id)

    @property
    def is_replaying(self) -> bool:
        """True while the run replays recorded events (logs are demoted then, §2.15)."""
        return self._history.is_replaying

    # -- join sets ---------------------------------------------------------------------------

    def join_set(self, name: str | None = None) -> JoinSet:
        """A new join set: generated (``g:<n>``) or named (``n:<name>``; a taken or invalid
        name raises ``JoinSetConflict`` / ``InvalidJoinSetName``, recording nothing). Use it
        as ``with ctx.join_set() as js:``; leaving the block closes it (§5.1): unawaited
        activities and delays are cancelled, child workflows are awaited."""
        return JoinSet(self, str(self._history.create_join_set(name)))

    def get(self, fn: FunctionRef, child_id: str) -> RetVal:
        """The result of a child whose response was already consumed (``-get``, §2.7)."""
        spec, ffqn = _resolve(self._history, fn)
        return _typed(spec, self._history.get(ffqn, child_id))

    # -- one-off calls -----------------------------------------------------------------------

    def call(self, fn: FunctionRef, *args: Any) -> Any:
        """Run ``fn`` as a child and wait for it; returns its value. An error value or a
        failure of the child (timed out, cancelled, nondeterminism, …) raises
        ``ChildFailed`` with ``retval`` (``Err`` or ``ExecutionFailure``): a typed outcome the
        workflow may catch, not a crash of its own."""
        spec, ffqn = _resolve(self._history, fn)
        try:
            value = self._history.call(ffqn, _params(self._history, spec, args), _component_type(spec))
        except ChildFailed as failure:
            raise ChildFailed(failure.child_id, _typed(spec, failure.retval)) from None
        return _decode(spec, value)

    def invoke(self, fn: FunctionRef, *args: Any, label: str) -> tuple[str, RetVal]:
        """Like ``call`` in a one-off join set named after ``label``; returns
        ``(child id, Ok | Err | ExecutionFailure)`` instead of raising."""
        spec, ffqn = _resolve(self._history, fn)
        params = _params(self._history, spec, args)
        child_id, retval = self._history.invoke(label, ffqn, params, _component_type(spec))
        return str(child_id), _typed(spec, retval)

    def sleep(self, duration_or_until: timedelta | datetime) -> datetime:
        """A durable timer: returns when it fires (its expiry, the same on every replay);
        ``DelayCancelled`` if the delay was cancelled."""
        return self._history.sleep(duration_or_until)

    def schedule(self, fn: FunctionRef, *args: Any, at: timedelta | datetime | None = None) -> str:
        """Start ``fn`` as a new top-level execution now or ``at`` a time; fire and forget."""
        spec, ffqn = _resolve(self._history, fn)
        return str(self._history.schedule(ffqn, _params(self._history, spec, args), at))

    def stub(self, fn: FunctionRef, child_id: str, value: Any = None, *, error: bool = False) -> None:
        """Supply the result of a child (normally an activity stub); ``StubConflict`` if it
        already finished with another value."""
        _, ffqn = _resolve(self._history, fn)
        self._history.stub(ffqn, child_id, Err(value) if error else Ok(value))

    # -- deterministic values ----------------------------------------------------------------

    def now(self) -> datetime:
        """The time, recorded on the first run and replayed after (decision 4)."""
        return self._history.now()

    def patched(self, change_id: str) -> bool:
        """True on the new code path of a change: in executions started after it, and in
        those that reach it after an upgrade; False in an execution whose history was
        recorded by the code before it. Keep both paths until no execution needs the old
        one (``obelisk_deploy upgrade --dry-run`` tells). why: D112."""
        return self._history.patched(change_id)

    def random_u64(self, low: int, high_exclusive: int) -> int:
        return self._history.random_u64(low, high_exclusive)

    def random_string(self, min_length: int, max_length_exclusive: int) -> str:
        return self._history.random_string(min_length, max_length_exclusive)

    def uuid(self) -> _uuid.UUID:
        """A version-4 UUID from two recorded 64-bit draws."""
        high = self._history.random_u64_inclusive(0, 2**64 - 1)
        low = self._history.random_u64_inclusive(0, 2**64 - 1)
        return _uuid.UUID(int=(high << 64) | low, version=4)


class JoinSet:
    """A join set of a running workflow (structured concurrency, spec 002 §2)."""

    def __init__(self, ctx: WorkflowContext, join_set_id: str):
        self._ctx = ctx
        self.id = join_set_id

    def __enter__(self) -> JoinSet:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # An interrupt or a fatal error unwinds without more host calls (§8.1); an ordinary
        # exception closes the join set like a normal exit (decision 3).
        if exc is not None and isinstance(exc, WorkflowSignal):
            return
        if self.id in self._ctx._history.open_join_sets():
            self.close()

    def submit(self, fn: FunctionRef, *args: Any) -> str:
        """Start ``fn`` (an activity or a child workflow) in this join set; its child id."""
        history = self._ctx._history
        spec, ffqn = _resolve(history, fn)
        return str(history.submit(self.id, ffqn, _params(history, spec, args), _component_type(spec)))

    def submit_delay(self, duration_or_until: timedelta | datetime) -> str:
        """A durable timer in this join set; its response is ok when it fires."""
        return str(self._ctx._history.submit_delay(self.id, duration_or_until))

    def join_next(self) -> tuple[str, bool]:
        """Wait for the next response: ``(child or delay id, ok)``; ``AllProcessed`` when
        everything submitted was awaited."""
        response_id, ok = self._ctx._history.join_next(self.id)
        return str(response_id), ok

    def await_next(self, fn: FunctionRef) -> tuple[str, RetVal]:
        """Wait for the next response, a child of ``fn``: ``(child id, Ok | Err |
        ExecutionFailure)``; ``FunctionMismatch`` if it was another's (it is consumed)."""
        spec, ffqn = _resolve(self._ctx._history, fn)
        child_id, retval = self._ctx._history.await_next(self.id, ffqn)
        return str(child_id), _typed(spec, retval)

    def close(self) -> None:
        self._ctx._history.close_join_set(self.id)


class _ReplayAwareLogger(logging.LoggerAdapter):
    """Workflow logging: while replaying, records are demoted to DEBUG and marked
    ``(replay)``, so a replay does not repeat what the first run logged (§2.15)."""

    def __init__(self, base: logging.Logger, history: EventHistory, execution_id: str):
        super().__init__(base, {"execution_id": execution_id})
        self._history = history

    def log(self, level, msg, *args, **kwargs):
        if self._history.is_replaying:
            level, msg = logging.DEBUG, f"(replay) {msg}"
        super().log(level, msg, *args, **kwargs)


class RefusedCall(ImportedFunctionCallError):
    """A host call refused before it reached the history (D98): a function that is not an
    activity or a workflow, arguments its signature refuses. Fatal, as spec 002 §5.3 has
    ``ImportedFunctionCallError``: the execution finishes failed in the run that meets it,
    instead of being retried forever; ``detail`` shows where the workflow's code made it."""

    def __init__(self, ffqn: str, message: str):
        super().__init__(ffqn, message)
        self.detail = _call_site()

    def failure(self) -> ExecutionFailure:
        return ExecutionFailure(self.kind, self.reason(), self.detail)


def _resolve(history: EventHistory, fn: FunctionRef) -> tuple[Function | None, str]:
    """The registered function ``fn`` is (or names). A name is resolved by the writer, which
    refuses one nobody registered; anything else must be a decorated function."""
    if isinstance(fn, Function):
        return fn, fn.ffqn
    if isinstance(fn, str):
        return lookup(fn), fn
    name = f"{fn.__module__}.{fn.__qualname__}" if hasattr(fn, "__qualname__") else repr(fn)
    message = f"`{name}` is not an activity or a workflow; decorate it with @activity (or @workflow) to call it"
    raise history.refused(RefusedCall(name, message + " from a workflow"))


def _component_type(spec: Function | None) -> str:
    return spec.kind if spec is not None else "activity"


def _params(history: EventHistory, spec: Function | None, args: tuple) -> list:
    if spec is None:
        return list(args)
    try:
        return spec.encode_arguments(list(args))
    except ArgumentError as error:
        raise history.refused(RefusedCall(spec.ffqn, str(error))) from None


def _call_site() -> str:
    """The workflow's own frames (outermost first) up to the refused call, as a traceback
    shows them: those between the authoring API's frames and the runner's."""
    engine = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(engine):
        frame = frame.f_back  # this module's own frames
    own = []
    while frame is not None and not frame.f_code.co_filename.startswith(engine):
        own.append((frame, frame.f_lineno))
        frame = frame.f_back
    return "".join(traceback.format_list(traceback.StackSummary.extract(reversed(own))))


def _decode(spec: Function | None, value: Any) -> Any:
    if spec is None:
        return value
    return spec.decode_result(value)


def _typed(spec: Function | None, retval: RetVal) -> RetVal:
    """An ``Ok`` value decoded with the function's return type; errors as they are."""
    return Ok(_decode(spec, retval.value)) if isinstance(retval, Ok) else retval
