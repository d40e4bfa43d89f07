"""OpenTelemetry for the worker runtime: a span per execution attempt, and metrics.

Off by default. ``setup_from_environment()`` turns it on in a process when

- ``OBELISK_OTEL`` is ``1``/``true`` (``0``/``false`` keeps it off whatever else is set), or
- ``OBELISK_OTEL`` is unset, ``OTEL_SDK_DISABLED`` is not ``true``, and one of
  ``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER`` (other than ``none``) or
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.

Everything else is the standard ``OTEL_*`` configuration, read by the SDK: exporters by
name (``otlp`` needs ``opentelemetry-exporter-otlp``; ``console`` ships with the SDK),
``OTEL_SERVICE_NAME`` (default ``obelisk-worker``), ``OTEL_RESOURCE_ATTRIBUTES``, the
sampler, batch and export intervals. A process whose OpenTelemetry SDK is already
configured (``opentelemetry-instrument``) keeps its providers.

What is recorded (names in the README, "Observability"):

- a span ``run <ffqn>`` per activity attempt and per workflow run, child of the trace
  context the execution's metadata carries (``executions.tracing``: the submitter's, or
  the workflow run that created it), with ``obelisk.execution_id``, ``obelisk.ffqn``,
  ``obelisk.attempt``, ``obelisk.component_type``, ``obelisk.run_id`` and
  ``obelisk.outcome``; a workflow run puts its own context into the children it creates,
  so a workflow tree is one trace;
- counters ``obelisk.executions.started`` / ``.finished`` / ``.failed``, histograms
  ``obelisk.execution.latency`` (first due → finished) and ``obelisk.claim.duration``,
  and the observable gauge ``obelisk.backlog`` (due executions per function, read by the
  ``obelisk_worker`` process only).

The hot path checks ``ENABLED`` (a module flag) and creates nothing when it is off. The
authoring API (``workers.activity``, ``workers.workflow``) does not import this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from django.db import connection
from django.utils import timezone
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from executions import errors, store, tracing
from executions.events import Finished, Unlocked
from executions.outage import DATABASE_ERRORS
from executions.outcome import outcome_of_retval
from executions.state_machine import retry_backoff

logger = logging.getLogger("obelisk.telemetry")

ENABLED = False  # checked on the hot path: nothing is created while it is False
INSTRUMENTATION = "obelisk"

_tracer: trace.Tracer | None = None
_meter: metrics.Meter | None = None
_owned: list = []  # providers this module built (shut down by ``shutdown``)
_instruments: _Instruments | None = None
_unwritten: dict[str, _Attempt] = {}  # execution id → attempt whose result awaits its write


@dataclass(frozen=True)
class _Instruments:
    started: metrics.Counter
    finished: metrics.Counter
    failed: metrics.Counter
    latency: metrics.Histogram
    claim: metrics.Histogram


@dataclass(frozen=True)
class _Attempt:
    ffqn: str
    outcome: str
    final: bool  # the attempt finishes the execution


# -- configuration ------------------------------------------------------------------------


def wanted(environ=None) -> bool:
    """Whether the environment asks for telemetry (the rule in the module docstring)."""
    env = os.environ if environ is None else environ
    explicit = env.get("OBELISK_OTEL", "").strip().lower()
    if explicit in ("1", "true", "yes", "on"):
        return True
    if explicit in ("0", "false", "no", "off"):
        return False
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [env.get("OTEL_TRACES_EXPORTER", ""), env.get("OTEL_METRICS_EXPORTER", "")]
    named = any(value.strip() and value.strip().lower() != "none" for value in exporters)
    return named or bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


def setup(*, tracer_provider=None, meter_provider=None) -> None:
    """Turn telemetry on with these providers (the tests' in-memory ones), or with the
    global providers when None."""
    global ENABLED, _tracer, _meter, _instruments
    _tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(INSTRUMENTATION)
    _meter = (meter_provider or metrics.get_meter_provider()).get_meter(INSTRUMENTATION)
    _instruments = _Instruments(
        started=_meter.create_counter(
            "obelisk.executions.started", unit="{attempt}", description="Activity attempts and workflow runs started"
        ),
        finished=_meter.create_counter(
            "obelisk.executions.finished", unit="{execution}", description="Executions finished, by outcome"
        ),
        failed=_meter.create_counter(
            "obelisk.executions.failed",
            unit="{attempt}",
            description="Attempts that did not succeed: error values, failures, and failed attempts to be retried",
        ),
        latency=_meter.create_histogram(
            "obelisk.execution.latency", unit="s", description="From first due (submitted or scheduled for) to finished"
        ),
        claim=_meter.create_histogram(
            "obelisk.claim.duration", unit="s", description="How long a claim (lock_pending transaction) took"
        ),
    )
    _unwritten.clear()
    ENABLED = True


def setup_from_environment() -> bool:
    """Configure and enable telemetry if the environment asks for it (idempotent); returns
    whether it is on. In a worker process it is called after the fork."""
    if ENABLED:
        return True
    if not wanted():
        return False
    try:
        tracer_provider, meter_provider = _sdk_providers()
    except Exception:
        logger.exception("OpenTelemetry could not be configured; telemetry stays off")
        return False
    setup(tracer_provider=tracer_provider, meter_provider=meter_provider)
    logger.info("OpenTelemetry on: spans and metrics of execution attempts are exported")
    return True


def _sdk_providers():
    """The global SDK providers, built from the ``OTEL_*`` variables unless already set."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "obelisk-worker"
    resource = Resource.create(attributes)
    default = "otlp"
    tracer_provider = trace.get_tracer_provider()
    if not isinstance(tracer_provider, TracerProvider):
        tracer_provider = TracerProvider(resource=resource)
        for exporter in _exporters("opentelemetry_traces_exporter", os.environ.get("OTEL_TRACES_EXPORTER", default)):
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        _owned.append(tracer_provider)
    meter_provider = metrics.get_meter_provider()
    if not isinstance(meter_provider, MeterProvider):
        readers = [
            PeriodicExportingMetricReader(exporter)
            for exporter in _exporters(
                "opentelemetry_metrics_exporter", os.environ.get("OTEL_METRICS_EXPORTER", default)
            )
        ]
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        _owned.append(meter_provider)
    _flush_at_process_exit()
    return tracer_provider, meter_provider


def _exporters(group: str, names: str) -> list:
    """Exporters named in an ``OTEL_*_EXPORTER`` list, found by their entry points."""
    from importlib.metadata import entry_points

    found = []
    for name in (n.strip() for n in names.split(",")):
        if not name or name == "none":
            continue
        points = entry_points(group=group, name=name)
        if not points:
            hint = " (pip install opentelemetry-exporter-otlp)" if name.startswith("otlp") else ""
            logger.warning("no OpenTelemetry exporter %r in %s%s; skipped", name, group, hint)
            continue
        found.append(next(iter(points)).load()())
    return found


def _flush_at_process_exit() -> None:
    """django-q2's worker processes end through multiprocessing, which skips ``atexit``:
    flush the buffered spans and metrics from its exit hooks instead."""
    import multiprocessing
    from multiprocessing import util

    if multiprocessing.parent_process() is not None:
        util.Finalize(None, shutdown, exitpriority=10)


def shutdown() -> None:
    """Flush and stop the providers this module built; telemetry is off afterwards."""
    global ENABLED
    ENABLED = False
    for provider in _owned:
        try:
            provider.shutdown()
        except Exception:  # exporting at exit is best effort
            logger.debug("telemetry shutdown failed", exc_info=True)
    _owned.clear()


def reset() -> None:
    """Off, and forget the providers (tests)."""
    global ENABLED, _tracer, _meter, _instruments
    ENABLED = False
    _tracer = _meter = _instruments = None
    _unwritten.clear()


# -- the executor's hooks -----------------------------------------------------------------


def _attributes(locked: store.LockedExecution) -> dict:
    return {
        "obelisk.execution_id": locked.execution_id,
        "obelisk.ffqn": locked.ffqn,
        "obelisk.attempt": locked.intermittent_event_count + 1,
        "obelisk.component_type": locked.component_type,
        "obelisk.run_id": locked.fence.run_id,
    }


def run_attempt(run_one, locked: store.LockedExecution):
    """``Executor._run_one`` inside the attempt's span; the outcome is counted once
    its write succeeded (``results_written``)."""
    attributes = _attributes(locked)
    _instruments.started.add(1, {"obelisk.ffqn": locked.ffqn, "obelisk.component_type": locked.component_type})
    with _tracer.start_as_current_span(
        f"run {locked.ffqn}", context=tracing.context_of(locked.metadata), kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        item = run_one(locked)
        attempt = _attempt_of(locked, item)
        span.set_attribute("obelisk.outcome", attempt.outcome)
        if attempt.outcome not in ("ok", "handed_back"):
            span.set_status(Status(StatusCode.ERROR, attempt.outcome))
    if item is not None and attempt.outcome != "handed_back":
        _unwritten[item.execution_id] = attempt
    return item


def results_written(items: list[store.AppendItem], results: list) -> None:
    """After a group commit: count what was recorded, with the latency of what finished."""
    try:
        finished = []
        for item, result in zip(items, results, strict=True):
            attempt = _unwritten.pop(item.execution_id, None)
            if attempt is None:
                continue
            if isinstance(result, errors.ValidationFailed) and attempt.final:  # rewritten as failed
                attempt = _Attempt(attempt.ffqn, "uncategorized", True)
            elif isinstance(result, errors.StoreError):
                continue
            _count(attempt)
            if attempt.final:
                finished.append((item.execution_id, attempt))
        _record_latency(finished)
    except Exception:  # telemetry never costs a result
        logger.debug("telemetry of written results failed", exc_info=True)


def claimed(seconds: float, count: int, *, workflows: bool) -> None:
    _instruments.claim.record(seconds, {"obelisk.kind": "workflow" if workflows else "activity"})


@contextlib.contextmanager
def workflow_run(locked: store.LockedExecution):
    """A workflow run's span (``workers.workflow_runner.run_workflow``): its outcome is
    ``suspended`` unless the run finished the execution (``workflow_finished``)."""
    if not ENABLED:
        yield
        return
    _instruments.started.add(1, {"obelisk.ffqn": locked.ffqn, "obelisk.component_type": locked.component_type})
    attributes = _attributes(locked) | {"obelisk.outcome": "suspended"}
    with _tracer.start_as_current_span(
        f"run {locked.ffqn}", context=tracing.context_of(locked.metadata), kind=SpanKind.CONSUMER, attributes=attributes
    ):
        yield


def workflow_finished(locked: store.LockedExecution, event: Finished) -> None:
    """The run appended its ``Finished``: the span's outcome, the counters and latency."""
    try:
        outcome = outcome_of_retval(event.retval)
        span = trace.get_current_span()
        span.set_attribute("obelisk.outcome", outcome)
        if outcome != "ok":
            span.set_status(Status(StatusCode.ERROR, outcome))
        attempt = _Attempt(locked.ffqn, outcome, True)
        _count(attempt)
        _record_latency([(locked.execution_id, attempt)])
    except Exception:
        logger.debug("telemetry of a finished workflow failed", exc_info=True)


def observe_backlog() -> None:
    """Register the ``obelisk.backlog`` gauge (in the ``obelisk_worker`` process only: each
    collection is one store read, on the metric reader's thread)."""
    if ENABLED:
        _meter.create_observable_gauge(
            "obelisk.backlog",
            callbacks=[_backlog],
            unit="{execution}",
            description="Executions due and waiting for a worker, per function",
        )


def _backlog(options):
    try:
        counts = store.backlog()
    except DATABASE_ERRORS:
        return []
    finally:
        connection.close()  # the reader's thread keeps no connection between collections
    return [metrics.Observation(n, {"obelisk.ffqn": ffqn}) for ffqn, n in counts.items()]


# -- outcomes -----------------------------------------------------------------------------


def _attempt_of(locked: store.LockedExecution, item: store.AppendItem | None) -> _Attempt:
    """What the attempt came to: a finished outcome, ``temporarily_failed`` /
    ``temporarily_timed_out`` (retries left), ``handed_back`` or ``lock_lost``."""
    if item is None:
        return _Attempt(locked.ffqn, "lock_lost", False)
    event = item.event
    if isinstance(event, Finished):
        return _Attempt(locked.ffqn, outcome_of_retval(event.retval), True)
    if isinstance(event, store.AttemptFailed):
        retry = locked.locked.retry_config
        if retry_backoff(locked.intermittent_event_count + 1, retry.max_retries, retry.retry_exp_backoff) is not None:
            return _Attempt(locked.ffqn, "temporarily_timed_out" if event.timed_out else "temporarily_failed", False)
        return _Attempt(locked.ffqn, outcome_of_retval(event.final.retval), True)
    if isinstance(event, Unlocked):
        return _Attempt(locked.ffqn, "handed_back", False)
    return _Attempt(locked.ffqn, getattr(event, "VARIANT", type(event).__name__), False)


def _count(attempt: _Attempt) -> None:
    attributes = {"obelisk.ffqn": attempt.ffqn, "obelisk.outcome": attempt.outcome}
    if attempt.final:
        _instruments.finished.add(1, attributes)
    if attempt.outcome != "ok":
        _instruments.failed.add(1, attributes)


def _record_latency(finished: list[tuple[str, _Attempt]]) -> None:
    if not finished:
        return
    due = store.first_scheduled_at([execution_id for execution_id, _ in finished])
    now = timezone.now()
    for execution_id, attempt in finished:
        if execution_id in due:
            seconds = max(0.0, (now - due[execution_id]).total_seconds())
            _instruments.latency.record(seconds, {"obelisk.ffqn": attempt.ffqn, "obelisk.outcome": attempt.outcome})
