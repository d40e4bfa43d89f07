"""Activity stubs for ``run_workflow``: what replaces an activity in a test, and the calls.

A stub is given per function (the decorated function or its name) and is one of:

- a value: the activity returns it (checked against the function's return type up front);
- an ``ActivityError``: the activity returns that error value;
- an exception (instance or class): the attempt fails and is retried as the function is
  configured (``max_retries``, ``backoff``: the back-off passes in virtual time);
- a callable: called with the activity's arguments, ``current_activity()`` working;
- ``sequence(a, b, c)``: one per attempt, in order (fail twice, then succeed);
- ``timed_out``: the attempt ends as a worker's watchdog ends one past its timeout (the
  runner's own ``ActivityTimedOut``: retried as a timeout, finally ``timed_out``).

The stand-in keeps the function's name, component, retries, back-off and types, so it
runs through the executor exactly as the real one would (``dataclasses.replace`` of the
registered ``Function``). Every call of every activity, stubbed or real, is recorded.
why: D121
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.activity import ActivityError, current_activity
from workers.activity_runner import ActivityTimedOut
from workers.registry import ArgumentError, Function, lookup

timed_out = ActivityTimedOut  # a stub: the attempt timed out (retried as a timeout)


class StubError(ValueError):
    """A stub that cannot stand for its function: named, with what is wrong."""


class UnusedStubs(AssertionError):
    """Stubs of functions the workflow never called (a test that stubs what it does not
    exercise tests less than it says)."""


@dataclass(frozen=True)
class sequence:  # noqa: N801 - reads as a word in a stub table: sequence(error, error, "ok")
    """One outcome per attempt, in order: ``sequence(ConnectionError(), "paid")``."""

    outcomes: tuple

    def __init__(self, *outcomes: Any):
        if not outcomes:
            raise StubError("sequence() needs at least one outcome")
        object.__setattr__(self, "outcomes", outcomes)


@dataclass(frozen=True)
class Call:
    """One attempt of an activity: its arguments, its attempt number and what it did
    (``{"ok": …}``, ``{"err": …}`` or ``{"raised": "Type: message"}``)."""

    ffqn: str
    execution_id: str
    args: tuple
    attempt: int
    outcome: dict
    stubbed: bool


@dataclass
class Stubs:
    """The stubs of one ``run_workflow`` and the calls it made."""

    by_ffqn: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # a stub that went wrong while running
    _taken: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, activities: Mapping[Any, Any] | None) -> Stubs:
        """Check every stub before anything runs: the function exists, is an activity, and
        a value fits its return type."""
        stubs = cls()
        for key, stub in (activities or {}).items():
            spec = _function(key)
            for outcome in stub.outcomes if isinstance(stub, sequence) else (stub,):
                _check_outcome(spec, outcome)
            stubs.by_ffqn[spec.ffqn] = stub
        return stubs

    def stand_in(self, spec: Function) -> Function:
        """The function the executor runs for ``spec``: its stub, or itself, recording calls."""
        stubbed = spec.ffqn in self.by_ffqn
        body = self._stub_body(spec) if stubbed else spec.fn

        def recorded(*args):
            context = current_activity()
            try:
                value = body(*args)
            except ActivityError as error:
                self._record(spec, context, args, {"err": error.value}, stubbed)
                raise
            except BaseException as error:  # a timed_out stub raises the runner's interrupt
                self._record(spec, context, args, {"raised": f"{type(error).__name__}: {error}"}, stubbed)
                raise
            self._record(spec, context, args, {"ok": value}, stubbed)
            return value

        return dataclasses.replace(spec, fn=recorded)

    def unused(self) -> list[str]:
        called = {call.ffqn for call in self.calls}
        return sorted(ffqn for ffqn in self.by_ffqn if ffqn not in called)

    def of(self, fn: Any) -> list[Call]:
        ffqn = fn.ffqn if isinstance(fn, Function) else str(fn)
        return [call for call in self.calls if call.ffqn == ffqn]

    def _stub_body(self, spec: Function) -> Callable:
        stub = self.by_ffqn[spec.ffqn]

        def body(*args):
            outcome = stub
            if isinstance(stub, sequence):
                taken = self._taken.get(spec.ffqn, 0)
                if taken >= len(stub.outcomes):
                    message = f"{spec.ffqn}: its stub sequence has {len(stub.outcomes)} outcome(s), attempt {taken + 1} asked for one more"
                    self.problems.append(message)
                    raise StubError(message)
                self._taken[spec.ffqn] = taken + 1
                outcome = stub.outcomes[taken]
            return _play(spec, outcome, args)

        return body

    def _record(self, spec: Function, context, args: tuple, outcome: dict, stubbed: bool) -> None:
        self.calls.append(Call(spec.ffqn, context.execution_id, args, context.attempt, outcome, stubbed))


def _function(key: Any) -> Function:
    if isinstance(key, Function):
        spec = key
    elif isinstance(key, str):
        spec = lookup(key)
        if spec is None:
            raise StubError(f"cannot stub `{key}`: no function of that name is registered (is its module imported?)")
    else:
        raise StubError(f"cannot stub {key!r}: give an @activity function or its name (`py:pkg/module.fn`)")
    if spec.kind != "activity":
        raise StubError(f"cannot stub `{spec.ffqn}`: it is a {spec.kind}; only activities are stubbed")
    return spec


def _is_exception(outcome: Any) -> bool:
    return isinstance(outcome, BaseException) or (isinstance(outcome, type) and issubclass(outcome, BaseException))


def _check_outcome(spec: Function, outcome: Any) -> None:
    if isinstance(outcome, sequence):
        raise StubError(f"{spec.ffqn}: a sequence cannot hold another sequence")
    if _is_exception(outcome) or callable(outcome):
        return
    try:
        spec.encode_result(outcome)
    except ArgumentError as error:
        raise StubError(f"the stub of {spec.ffqn} does not fit its return type: {error}") from None


def _play(spec: Function, outcome: Any, args: tuple) -> Any:
    if _is_exception(outcome):
        raise outcome
    if callable(outcome):
        return outcome(*args)
    return outcome
