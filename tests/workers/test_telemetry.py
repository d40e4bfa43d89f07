"""OpenTelemetry: spans per attempt, one trace per workflow tree, metrics (``workers.telemetry``).

Executions run in this process, through the real store, with an ``Executor`` as a
worker process runs it (activities in the main thread, workflow runs in pool threads);
spans and metrics go to the SDK's in-memory exporter and reader.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from executions import store, tracing
from executions.ids import ExecutionId
from tests.support import components, workflows
from workers import telemetry
from workers.activity_runner import Watchdog
from workers.components import load_components
from workers.executor import Executor
from workers.testing import current_deployment_id, submit

pytestmark = pytest.mark.django_db(transaction=True)
SAFETY = 30.0  # seconds: a safety limit, never an assertion about timing


class Telemetry:
    def __init__(self):
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def runs(self, ffqn: str | None = None) -> list:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith("run ") and ffqn in (None, s.name[4:])]

    def points(self, name: str) -> list:
        """The data points of metric ``name`` (cumulative), each with its attributes."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def sum(self, name: str, **attributes) -> int:
        wanted = {f"obelisk.{key}": value for key, value in attributes.items()}
        return sum(p.value for p in self.points(name) if all(p.attributes.get(k) == v for k, v in wanted.items()))


@pytest.fixture
def otel():
    recorded = Telemetry()
    telemetry.setup(tracer_provider=recorded.tracer_provider, meter_provider=recorded.meter_provider)
    try:
        yield recorded
    finally:
        telemetry.reset()


@pytest.fixture
def executor(monkeypatch):
    """An executor as a worker process has. Its watchdog thread outlives the test: its
    connection is made obsolete at once, so the thread closes it at its next idle tick
    (the test database can be dropped at the end)."""
    assert workflows.child_workflow and components.add  # both modules registered
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    yield Executor(load_components(), current_deployment_id())
    time.sleep(3 * Watchdog.IDLE_TICK)


def create_workflow(spec, *args) -> str:
    """A top-level workflow execution, with the current trace in its metadata as
    ``client.submit`` puts it. (Not ``client.submit``: the deployment catalog cannot tell
    apart the activity and workflow components of one module, ``tests.support.workflows``, as they
    share a digest, so it does not find the workflow.)"""
    execution_id = str(ExecutionId.generate())
    store.create(
        store.CreateRequest(
            execution_id=execution_id,
            ffqn=spec.ffqn,
            params=spec.encode_arguments(list(args)),
            component_id=spec.component_id,
            deployment_id=current_deployment_id(),
            metadata=tracing.with_trace(None),
        )
    )
    return execution_id


def run_until_finished(executor: Executor, *execution_ids: str) -> None:
    deadline = time.monotonic() + SAFETY
    while not all(store.get_state(e).is_finished for e in execution_ids):
        assert time.monotonic() < deadline, "the executions did not finish"
        executor.claim_and_run(budget=0.3, linger=0.05)
    executor.workflows.join(SAFETY)


def test_an_activity_attempt_is_one_span_with_its_attributes_and_metrics(otel, executor):
    execution_id, _ = submit(components.add.ffqn, [1, 2])
    run_until_finished(executor, execution_id)
    (span,) = otel.runs()
    assert span.name == f"run {components.add.ffqn}"
    assert span.attributes["obelisk.execution_id"] == execution_id
    assert span.attributes["obelisk.ffqn"] == components.add.ffqn
    assert span.attributes["obelisk.attempt"] == 1
    assert span.attributes["obelisk.outcome"] == "ok"
    assert span.attributes["obelisk.component_type"] == "activity"
    assert span.parent is None  # submitted outside any span: a trace of its own
    assert otel.sum("obelisk.executions.started", ffqn=components.add.ffqn) == 1
    assert otel.sum("obelisk.executions.finished", ffqn=components.add.ffqn, outcome="ok") == 1
    assert otel.sum("obelisk.executions.failed") == 0
    (latency,) = otel.points("obelisk.execution.latency")
    assert latency.count == 1 and latency.attributes["obelisk.outcome"] == "ok" and latency.sum >= 0
    claims = otel.points("obelisk.claim.duration")
    assert sum(p.count for p in claims) >= 1


def test_a_retried_activity_gives_a_span_per_attempt(otel, executor):
    execution_id, _ = submit(components.fail_until.ffqn, [2])
    run_until_finished(executor, execution_id)
    spans = sorted(otel.runs(), key=lambda s: s.attributes["obelisk.attempt"])
    assert [s.attributes["obelisk.attempt"] for s in spans] == [1, 2]
    assert [s.attributes["obelisk.outcome"] for s in spans] == ["temporarily_failed", "ok"]
    assert spans[0].status.status_code is StatusCode.ERROR
    assert {s.attributes["obelisk.execution_id"] for s in spans} == {execution_id}
    assert otel.sum("obelisk.executions.started", ffqn=components.fail_until.ffqn) == 2
    assert otel.sum("obelisk.executions.failed", outcome="temporarily_failed") == 1
    assert otel.sum("obelisk.executions.finished", outcome="ok") == 1


def test_a_final_failure_is_counted_finished_and_failed(otel, executor):
    execution_id, _ = submit(components.error_value.ffqn, ["E1"])
    run_until_finished(executor, execution_id)
    (span,) = otel.runs()
    assert span.attributes["obelisk.outcome"] == "error"
    assert otel.sum("obelisk.executions.finished", outcome="error") == 1
    assert otel.sum("obelisk.executions.failed", outcome="error") == 1


def test_a_submit_inside_a_span_carries_its_trace_into_the_execution(otel, executor):
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        execution_id, _ = submit(components.add.ffqn, [2, 3])
    created = store.get_created(execution_id)
    assert created.metadata["traceparent"].split("-")[1] == f"{request.get_span_context().trace_id:032x}"
    run_until_finished(executor, execution_id)
    (span,) = otel.runs()
    assert span.context.trace_id == request.get_span_context().trace_id
    assert span.parent.span_id == request.get_span_context().span_id


def test_a_workflow_and_its_child_activity_are_one_trace(otel, executor):
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        execution_id = create_workflow(workflows.child_workflow, 4)
    run_until_finished(executor, execution_id)
    assert store.get_finished_result(execution_id).value == 5
    trace_id = request.get_span_context().trace_id
    workflow_runs = otel.runs(workflows.child_workflow.ffqn)
    (child,) = otel.runs(workflows.fn2.ffqn)
    assert workflow_runs and all(s.context.trace_id == trace_id for s in workflow_runs)
    assert child.context.trace_id == trace_id
    assert child.parent.span_id in {s.context.span_id for s in workflow_runs}  # the run that created it
    assert all(s.parent.span_id == request.get_span_context().span_id for s in workflow_runs)
    assert child.attributes["obelisk.execution_id"].startswith(execution_id + ".")
    last = max(workflow_runs, key=lambda s: s.end_time)
    assert last.attributes["obelisk.outcome"] == "ok"
    assert last.attributes["obelisk.component_type"] == "workflow"
    assert otel.sum("obelisk.executions.finished", ffqn=workflows.child_workflow.ffqn, outcome="ok") == 1
    assert otel.sum("obelisk.executions.finished", ffqn=workflows.fn2.ffqn, outcome="ok") == 1


def test_off_by_default_nothing_is_recorded_nor_propagated(executor):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert not telemetry.ENABLED
    execution_id, _ = submit(components.add.ffqn, [1, 1])
    assert "traceparent" not in store.get_created(execution_id).metadata
    run_until_finished(executor, execution_id)
    assert exporter.get_finished_spans() == ()


def test_a_traceparent_the_caller_set_wins():
    metadata = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    provider = TracerProvider()
    with provider.get_tracer("test").start_as_current_span("request"):
        assert tracing.with_trace(metadata) == metadata
        assert set(tracing.with_trace({"a": "b"})) == {"a", "traceparent"}
    assert tracing.with_trace(None) == {}
    context = tracing.context_of(metadata)
    from opentelemetry import trace

    assert trace.get_current_span(context).get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OBELISK_OTEL": "1"}, True),
        ({"OBELISK_OTEL": "0", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_the_environment_decides_whether_telemetry_is_on(environ, on):
    assert telemetry.wanted(environ) is on


def test_the_backlog_gauge_reads_due_executions_per_function(otel):
    submit(components.noop.ffqn, [])
    submit(components.noop.ffqn, [])
    telemetry.observe_backlog()
    (point,) = otel.points("obelisk.backlog")
    assert point.value == 2 and point.attributes["obelisk.ffqn"] == components.noop.ffqn
