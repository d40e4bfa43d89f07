"""A safe upgrade: replay every in-flight workflow of one deployment against another's code.

``dry_run(FROM, TO)`` reads each unfinished execution pinned to a component of FROM that TO
replaces (same component name, another digest) and replays its recorded history against the
code this process imports (which must be TO's), in process, writing nothing: the replay's
writer refuses every write, so a run stops where the new code goes beyond what was recorded.
An execution replays cleanly when the new code consumes the whole recorded history without
nondeterminism; otherwise the report carries the side-by-side message the engine would record.
Activities have no history: they are always clean. ``apply`` moves the clean ones with
``store.upgrade_execution_component`` at the version replayed; the others never move.
why: D111, D112.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from executions import catalog, client, errors, store
from executions.events import HistoryEventRecord
from workers import determinism
from workers.registry import ArgumentError, Function
from workers.replay import EventHistory, FatalWorkflowError, NondeterminismDetected, WorkflowSignal
from workers.workflow import WorkflowContext


class NothingToUpgrade(errors.ValidationFailed):
    """The two deployments share no component: nothing of FROM runs on TO's code."""

    code = "no_shared_component"


class _WritesNothing(Exception):
    """The new code went past the recorded history: the dry run stops there."""


@dataclass(frozen=True)
class Verdict:
    """One execution's dry run: ``clean``, or the ``message`` the engine would record."""

    execution_id: str
    ffqn: str
    component: str
    from_digest: str
    to_digest: str
    version: int  # the version an upgrade writes at: the replayed history's next one
    clean: bool
    message: str | None = None
    note: str | None = None


@dataclass
class Report:
    from_deployment: str
    to_deployment: str
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def clean(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.clean]

    @property
    def nondeterministic(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.clean]

    def as_json(self) -> dict:
        return {
            "from_deployment": self.from_deployment,
            "to_deployment": self.to_deployment,
            "clean": len(self.clean),
            "nondeterministic": len(self.nondeterministic),
            "executions": [asdict(v) for v in self.verdicts],
        }


def replaced_components(from_id: str, to_id: str) -> dict[str, tuple[str, str]]:
    """``{component name: (FROM's digest, TO's digest)}`` of the components both deployments
    name; ``NothingToUpgrade`` when they share none."""
    before = {name: digest for name, _, digest in catalog.get_deployment(from_id).components}
    after = {name: digest for name, _, digest in catalog.get_deployment(to_id).components}
    shared = {name: (before[name], after[name]) for name in before.keys() & after.keys()}
    if not shared:
        raise NothingToUpgrade(f"deployments {from_id} and {to_id} share no component: nothing to upgrade")
    return shared


def dry_run(from_id: str, to_id: str, functions: Mapping[str, Function]) -> Report:
    """Replay every in-flight execution of FROM's replaced components against ``functions``
    (TO's code, imported by this process). Writes nothing."""
    report = Report(from_id, to_id)
    for name, (old, new) in sorted(replaced_components(from_id, to_id).items()):
        if old == new:
            continue
        for row in store.in_flight_of_component(old):
            report.verdicts.append(_verdict(row, name, new, functions))
    return report


def apply(
    report: Report, *, actor: str = client.SYSTEM_ACTOR, via: str = "python"
) -> tuple[list[str], list[tuple[str, str]]]:
    """Move each clean execution of ``report`` to TO at the version its dry run replayed,
    each in the audit trail; the nondeterministic ones stay. Returns ``(moved, refused)``:
    an execution that changed since its dry run (a ``VersionConflict``) or is running is
    refused, with why."""
    moved, refused = [], []
    for verdict in report.clean:
        try:
            client.upgrade(
                verdict.execution_id,
                old_digest=verdict.from_digest,
                new_digest=verdict.to_digest,
                deployment_id=report.to_deployment,
                version=verdict.version,
                actor=actor,
                via=via,
            )
            moved.append(verdict.execution_id)
        except (errors.VersionConflict, errors.IllegalState, errors.AlreadyFinished, errors.NotFound) as error:
            refused.append((verdict.execution_id, f"{error.code}: {error}"))
    return moved, refused


def _verdict(row: store.ExecutionSnapshot, component: str, new: str, functions: Mapping[str, Function]) -> Verdict:
    def verdict(clean: bool, version: int, message: str | None = None, note: str | None = None) -> Verdict:
        return Verdict(
            row.execution_id, row.ffqn, component, row.component_id_input_digest, new, version, clean, message, note
        )

    spec = functions.get(row.ffqn)
    if spec is None:
        return verdict(False, row.next_version, f"{row.ffqn} is not a function of the new code")
    if spec.kind != "workflow":
        return verdict(True, row.next_version, note="an activity: no history to replay")
    log = store.get(row.execution_id)
    clean, message = replay(spec, log)
    return verdict(clean, log.state.next_version, message)


def replay(spec: Function, log: store.ExecutionLog) -> tuple[bool, str | None]:
    """Run ``spec`` over the recorded history of ``log`` without writing: ``(True, None)``
    when it consumes the whole history, else ``(False, the failure the engine would record)``."""
    return replay_recorded(spec, log.state.execution_id, log.events, log.responses, log.state.next_version)


def replay_recorded(
    spec: Function,
    execution_id: str,
    events: Sequence[store.EventRecord],
    responses: Sequence[store.Response],
    next_version: int,
) -> tuple[bool, str | None]:
    """``replay`` of a history given as its parts: a stored log's, or an exported one's
    (``workers.testing.replay``, the same replay as the dry run's, D123). ``events`` start
    with ``Created`` (the call's parameters)."""
    history = EventHistory(
        execution_id,
        [(record.version, record.event) for record in events if isinstance(record.event, HistoryEventRecord)],
        responses,
        next_version=next_version,
        writer=_NoWrites(),
        canceller=_NoCancels(),
        clock=_frozen_clock(events),
    )
    trapped = _run(spec, WorkflowContext(history, execution_id), events[0].event.params, history)
    try:
        history.finalize()
    except FatalWorkflowError as fatal:
        return False, _message(fatal)
    except WorkflowSignal:  # went past the recorded history (a write refused), or interrupted
        pass
    if trapped is not None:
        return False, trapped
    return True, None


def _run(spec: Function, ctx: WorkflowContext, params: list, history: EventHistory) -> str | None:
    """Run the function; a trap while the history still replays is what the engine would
    record (a trap in new code is the new code's own outcome, not a replay failure)."""
    try:
        args = spec.decode_arguments(params)
        with determinism.guarding():
            spec.fn(ctx, *args)
    except WorkflowSignal:
        return None
    except ArgumentError as error:
        return f"parameters do not match the new code: {error}"
    except Exception as error:  # noqa: BLE001 - the workflow's own trap
        if history.is_replaying:
            return f"workflow trap while replaying: {type(error).__name__}: {error}"
    return None


def _message(fatal: FatalWorkflowError) -> str:
    failure = fatal.failure()
    if isinstance(fatal, NondeterminismDetected):
        return failure.detail or fatal.message
    return failure.reason or fatal.message


def _frozen_clock(events: Sequence[store.EventRecord]) -> Callable[[], datetime]:
    """The replay's clock: a new ``now()`` past the history is new code, never compared."""
    at = events[-1].created_at if events else datetime.now(UTC)
    return lambda: at


class _NoWrites:
    def append(self, version: int, events: Sequence[Any], creates: Sequence[Any]) -> None:
        raise _WritesNothing(f"the new code writes at version {version}: past the recorded history")

    def stub(self, ffqn: str, target: Any, retval: Any) -> bool:
        raise _WritesNothing("the new code stubs an execution: past the recorded history")


class _NoCancels:
    def cancel_activity(self, child_id: Any) -> None:
        raise _WritesNothing("cancel")

    def cancel_delay(self, delay_id: Any) -> None:
        raise _WritesNothing("cancel")
