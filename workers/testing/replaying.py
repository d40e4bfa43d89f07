"""Replaying recorded histories against the current code, with the deployment dry run's
replay (``workers.upgrade.replay_recorded``: writes refused, determinism guard on).

- ``replay(fn, history)``: an exported history (``executions.store.export``), kept as a
  fixture file in a user's repository, replayed in CI: a change that would break in-flight
  executions fails a test before it is deployed;
- ``check(spec, execution_id)``: ``run_workflow(replay_check=True)``'s check after each run,
  the history just recorded replayed as a crashed worker's successor would.

Nondeterminism is ``Nondeterministic`` (an ``AssertionError``: pytest shows its message)
carrying the engine's side-by-side message. why: D122, D123
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executions import store
from executions.store import export
from workers import upgrade
from workers.registry import Function, lookup


class HistoryError(ValueError):
    """A history that cannot be replayed: truncated, corrupted, or another function's."""


class Nondeterministic(AssertionError):
    """The code does not replay its recorded history; the message is the engine's."""

    def __init__(self, execution_id: str, message: str):
        super().__init__(f"{execution_id} does not replay against the current code:\n{message}")
        self.execution_id = execution_id
        self.detail = message


@dataclass(frozen=True)
class ReplayVerdict:
    execution_id: str
    ffqn: str
    events: int
    clean: bool
    message: str | None = None


def replay(fn: Function | str, history: Any, *, raise_on_nondeterminism: bool = True) -> ReplayVerdict:
    """Replay ``history`` (the export's dict, its JSON text, or a path to its file) against
    ``fn``'s current code. ``Nondeterministic`` when it does not replay (or, with
    ``raise_on_nondeterminism=False``, a verdict that says so); ``HistoryError`` when the
    history is not a complete one of ``fn``. Needs no database."""
    spec = _workflow(fn)
    recorded = _read(history)
    if recorded.ffqn != spec.ffqn:
        raise HistoryError(f"the history of {recorded.execution_id} is of {recorded.ffqn}, not of {spec.ffqn}")
    clean, message = upgrade.replay_recorded(
        spec, recorded.execution_id, recorded.events, recorded.responses, recorded.next_version
    )
    verdict = ReplayVerdict(recorded.execution_id, spec.ffqn, len(recorded.events), clean, message)
    if not clean and raise_on_nondeterminism:
        raise Nondeterministic(recorded.execution_id, message)
    return verdict


def check(spec: Function, execution_id: str) -> None:
    """The stored history of ``execution_id`` replays against ``spec``, or ``Nondeterministic``."""
    clean, message = upgrade.replay(spec, store.get(execution_id))
    if not clean:
        raise Nondeterministic(execution_id, message)


def _read(history: Any) -> export.ExportedHistory:
    if isinstance(history, Path):
        try:
            history = history.read_bytes()
        except OSError as error:
            raise HistoryError(f"cannot read the history file: {error}") from None
    try:
        return export.read_export(history)
    except export.InvalidExport as error:
        raise HistoryError(str(error)) from None


def _workflow(fn: Function | str) -> Function:
    spec = lookup(fn) if isinstance(fn, str) else fn
    if not isinstance(spec, Function) or spec.kind != "workflow":
        raise TypeError(f"replay needs an @workflow function or its registered name, got {fn!r}")
    return spec


def dumps(document: dict) -> str:
    """An export as the text a fixture file keeps (indented, keys in order)."""
    return json.dumps(document, indent=1, sort_keys=True)
