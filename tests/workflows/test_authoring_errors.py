"""Authoring mistakes fail at once with a clear error (issue 36, items 8, 9 and 10).

A new user's first mistakes must not hang, pass silently or end in a 30-line traceback:

- a workflow that calls a plain (undecorated) function as a child, or a function name
  nobody registered, or a function with arguments that do not fit, finishes failed at once,
  and the failure names the function and says what to do (D98). Before, the run ended
  without writing anything and its lock expired every 30 s, forever;
- the determinism guard holds for every way workflow code can reach the clock and the
  random sources: the module's own names, imports *inside* the workflow function, ``from
  time import time``, ``import datetime as d``, ``random.Random()``, ``os.urandom``,
  ``secrets``, ``uuid.uuid1/4``; the engine's own code in the same thread is not touched
  (D99);
- decorator mistakes are refused when the module is imported, in one line that says what
  to write; a worker started with a component module that does not exist (or that holds
  such a mistake) exits non-zero with that one line, no traceback.

Workflows run as a worker runs them: ``run_workflow`` in a thread against the real store
(``tests/support/workflow_runs.py``), and in real ``obelisk_worker`` clusters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

import tests.support.workflow_components as wfc
from executions import store
from executions.events import ExecutionFailure, Finished, Ok
from tests.support import workflows
from tests.support.clusters import BASE_DIR, current_database_url, started_clusters
from tests.support.clusters import outcomes as wait_for_outcomes
from tests.support.workflow_runs import World, create_root, events, result, run_root
from workers import activity, workflow
from workers.registry import RegistrationError, lookup
from workers.testing import submit
from workers.workflow import WorkflowContext

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 4  # a mistake fails the first run that meets it; more runs would be the old hang
RANDOM = "ctx.random_u64(...) or ctx.random_string(...)"


def run_until_finished(execution_id: str, spec, *, blocking: str | None = None) -> int:
    """Run the root (its children answered between runs) until it finished, at most
    ``RUNS`` times; the number of runs. An execution still unfinished fails the test."""
    world = World(execution_id)
    for runs in range(1, RUNS + 1):
        run_root(execution_id, spec, world, blocking=blocking)
        if store.get_state(execution_id).is_finished:
            world.settle()
            return runs
        world.settle()
    raise AssertionError(f"{execution_id} is still {store.get_state(execution_id).state} after {RUNS} runs")


def assert_failed_once(execution_id: str) -> ExecutionFailure:
    failure = result(execution_id)
    assert isinstance(failure, ExecutionFailure), failure
    assert [type(e) for e in events(execution_id)].count(Finished) == 1
    return failure


# ---------------------------------------------------------------------------------------------
# Item 8: a host call of a function that is not a registered activity or workflow
# ---------------------------------------------------------------------------------------------

UNDECORATED = "tests.support.workflows.plain_double"


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
@pytest.mark.parametrize("how", ["call", "submit", "schedule", "invoke", "caught"])
def test_a_child_call_of_an_undecorated_function_fails_the_workflow_at_once_naming_it(how, blocking):
    """Item 8 (D98): ``ctx.call`` / ``js.submit`` / ``ctx.schedule`` / ``ctx.invoke`` of a
    plain function finish the workflow failed in the run that meets the call (never retried,
    never left to its lock's expiry), with a reason that names the function and says to
    decorate it. It is a programming error, not an outcome: ``except Exception`` in the
    workflow does not swallow it."""
    spec = workflows.calls_undecorated
    execution_id = create_root(spec, how)
    run_until_finished(execution_id, spec, blocking=blocking)
    failure = assert_failed_once(execution_id)
    assert failure.kind == "uncategorized"
    assert failure.reason == (
        f"error calling imported function {UNDECORATED} : `{UNDECORATED}` is not an activity or a workflow; "
        "decorate it with @activity (or @workflow) to call it from a workflow"
    )
    assert "tests/support/workflows.py" in (failure.detail or ""), "the detail shows where the workflow made the call"
    assert store.get_state(execution_id).state == "finished"


def test_a_child_call_of_a_name_nobody_registered_fails_at_once_naming_it():
    """Item 8: a function *name* (a typo, a function of a module this worker does not load)
    cannot be created by this worker; the workflow fails at once naming it, instead of the
    write failing and the run being retried forever."""
    spec = workflows.calls_undecorated
    execution_id = create_root(spec, "unknown name")
    run_until_finished(execution_id, spec)
    failure = assert_failed_once(execution_id)
    assert failure.reason.startswith("error calling imported function test:wf/acts.no-such-function : ")
    assert "not registered" in failure.reason and "COMPONENT_MODULES" in failure.reason


def test_a_child_call_with_arguments_that_do_not_fit_fails_at_once_naming_the_argument():
    """Item 8's sibling: arguments refused by the child's signature fail the workflow at
    once (same path as an undecorated function), naming the argument."""
    spec = workflows.calls_undecorated
    execution_id = create_root(spec, "bad argument")
    run_until_finished(execution_id, spec)
    failure = assert_failed_once(execution_id)
    assert failure.reason.startswith("error calling imported function test:wf/acts.fn2 : ")
    assert "argument `x`" in failure.reason


# ---------------------------------------------------------------------------------------------
# Item 9: the determinism guard holds for imports inside the workflow function
# ---------------------------------------------------------------------------------------------

LOCAL_FORMS = {
    "import time": ("time.time()", "ctx.now()"),
    "from time import time": ("time.time()", "ctx.now()"),
    "from time import monotonic": ("time.monotonic()", "ctx.now()"),
    "import datetime as d": ("datetime.now()", "ctx.now()"),
    "from datetime import datetime": ("datetime.now()", "ctx.now()"),
    "from datetime import date": ("date.today()", "ctx.now().date()"),
    "time.localtime()": ("time.localtime()", "ctx.now()"),
    "time.strftime(format)": ("time.strftime()", "ctx.now()"),
    "import random": ("random.random()", RANDOM),
    "random.Random()": ("random.Random()", RANDOM),
    "random.SystemRandom()": ("random.SystemRandom()", RANDOM),
    "os.urandom": ("os.urandom()", RANDOM),
    "from os import urandom": ("os.urandom()", RANDOM),
    "secrets.token_hex": ("secrets.token_hex()", RANDOM),
    "from secrets import token_bytes": ("secrets.token_bytes()", RANDOM),
    "uuid.uuid1": ("uuid.uuid1()", "ctx.uuid()"),
    "uuid.uuid4": ("uuid.uuid4()", "ctx.uuid()"),
}


def guard_reason(name: str, instead: str) -> str:
    return (
        f"workflow trap: DeterminismError: `{name}` is not deterministic and cannot be used in a workflow "
        f"(it would differ on replay); use `{instead}`"
    )


@pytest.mark.parametrize("what", list(LOCAL_FORMS))
def test_a_local_import_does_not_bypass_the_determinism_guard(what):
    """Item 9 (D99): ``import time`` (and every other form) *inside* the workflow function,
    then the clock or a random source: the workflow fails naming the ``ctx`` call to use,
    also in a replaying run, instead of finishing ok with the wall clock as its result."""
    spec = workflows.forbidden_local
    execution_id = create_root(spec, what)
    run_until_finished(execution_id, spec)
    failure = assert_failed_once(execution_id)
    assert failure.reason == guard_reason(*LOCAL_FORMS[what])


MODULE_FORMS = {
    "random.Random()": ("random.Random()", RANDOM),
    "uuid.uuid1": ("uuid.uuid1()", "ctx.uuid()"),
    "secrets.token_bytes": ("secrets.token_bytes()", RANDOM),
}


@pytest.mark.parametrize("what", list(MODULE_FORMS))
def test_seedless_random_uuid1_and_secrets_through_the_modules_names_are_guarded(what):
    """Item 9, through the workflow module's own names: an unseeded ``random.Random()`` (the
    guard missed it), ``uuid.uuid1()`` and ``secrets.token_bytes()``."""
    spec = workflows.forbidden_seedless_random
    execution_id = create_root(spec, what)
    run_until_finished(execution_id, spec)
    assert assert_failed_once(execution_id).reason == guard_reason(*MODULE_FORMS[what])


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_deterministic_uses_logging_and_the_engines_own_code_still_work_in_a_workflow(blocking):
    """Item 9: the guard stops only the non-deterministic calls of workflow code. A seeded
    ``random.Random``, ``datetime`` arithmetic, ``time.strftime`` of a given time, logging
    (which reads the clock) and every host call (the engine reads the clock, draws ULIDs and
    writes the store in this very thread) all work, local imports included."""
    spec = workflows.deterministic_uses
    execution_id = create_root(spec)
    run_until_finished(execution_id, spec, blocking=blocking)
    value = result(execution_id)
    assert isinstance(value, Ok), value
    assert value.value == {
        "value": 3,
        "doubled": 4,
        "scheduled": True,
        "seeded": True,
        "later": "2020-01-02T00:00:00",
        "is_datetime": True,
        "formatted": value.value["formatted"],
        "uuid": "00000000-0000-0000-0000-000000000005",
    }
    assert value.value["formatted"].isdigit()


def test_the_modules_are_the_real_ones_outside_workflow_code():
    """Item 9: nothing outside a running workflow sees a change: the standard modules'
    functions are the originals, and a workflow module's activity uses them freely."""
    import datetime as d
    import random
    import time
    import uuid

    assert type(time.time()) is float and isinstance(d.datetime.now(), d.datetime)
    assert type(d.datetime.now()) is d.datetime
    assert random.Random().random() < 1 and uuid.uuid4().version == 4
    assert set(workflows.impure_values()) == {"time", "random", "uuid", "now", "urandom"}


# ---------------------------------------------------------------------------------------------
# Item 10: decorator mistakes are refused at registration, in one line that says what to write
# ---------------------------------------------------------------------------------------------


def no_ctx(x: int) -> int:
    return x


def no_parameters() -> int:
    return 0


def unannotated(x, y):
    return x


def context_named(context, x: int) -> int:
    return x


def context_annotated(c: WorkflowContext, x: int) -> int:
    return x


@pytest.mark.parametrize(
    ("fn", "write"),
    [
        (no_ctx, "def no_ctx(ctx, x: int)"),
        (no_parameters, "def no_parameters(ctx)"),
        (unannotated, "def unannotated(ctx, x, y)"),
    ],
)
def test_a_workflow_without_its_context_first_is_refused_at_registration_saying_what_to_write(fn, write):
    """Item 10: ``@workflow def f(x: int)`` used to register, and a submit then said
    "takes 0 argument(s), got 1". Now the decorator refuses it in one line that shows the
    signature to write, and nothing is registered."""
    name = f"test:auth/refused.{fn.__name__}"
    with pytest.raises(RegistrationError) as refused:
        workflow(name=name)(fn)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{name}: ")
    assert f"write `{write}`" in message
    assert lookup(name) is None


@pytest.mark.parametrize("fn", [context_named, context_annotated])
def test_a_workflow_whose_first_parameter_is_its_context_registers(fn):
    """Item 10: ``context`` (or any name annotated ``WorkflowContext``) is a context too."""
    spec = workflow(name=f"test:auth/accepted.{fn.__name__}")(fn)
    assert [p.name for p in spec.parameters] == ["x"]


def returns_one() -> int:
    return 1


def takes_ctx(ctx) -> int:
    return 1


ILL_TYPED = [
    (activity, {"backoff": 1}, "backoff must be a timedelta, not int 1: write `backoff=timedelta(seconds=1)`"),
    (activity, {"timeout": 5}, "timeout must be a timedelta, not int 5: write `timeout=timedelta(seconds=5)`"),
    (
        activity,
        {"lock_duration": 2.5},
        "lock_duration must be a timedelta, not float 2.5: write `lock_duration=timedelta(seconds=2.5)`",
    ),
    (activity, {"backoff": timedelta(seconds=-1)}, "backoff must not be negative"),
    (activity, {"timeout": timedelta(0)}, "timeout must be a positive timedelta"),
    (activity, {"max_retries": "3"}, "max_retries must be a whole number >= 0, or None to retry forever, not '3'"),
    (activity, {"max_retries": True}, "max_retries must be a whole number >= 0, or None to retry forever, not True"),
    (activity, {"max_retries": -1}, "max_retries must be a whole number >= 0, or None to retry forever, not -1"),
    (activity, {"name": 42}, 'name must be a string such as `name="myapp:billing/charge.run"`, not int 42'),
    (
        workflow,
        {"lock_duration": 30},
        "lock_duration must be a timedelta, not int 30: write `lock_duration=timedelta(seconds=30)`",
    ),
    (workflow, {"blocking": "wait"}, 'blocking must be "await" or "interrupt", not \'wait\''),
]


@pytest.mark.parametrize(("decorator", "options", "expected"), ILL_TYPED, ids=[str(o) for _, o, _ in ILL_TYPED])
def test_ill_typed_decorator_options_are_refused_in_one_line_saying_what_to_write(decorator, options, expected):
    """Item 10: ``@activity(backoff=1)`` used to be accepted (and the run to fail later, or
    worse, never); every option is checked when the module is imported."""
    fn = takes_ctx if decorator is workflow else returns_one
    with pytest.raises(RegistrationError) as refused:
        decorator(**options)(fn)
    message = str(refused.value)
    assert "\n" not in message
    assert message.endswith(expected), message


def test_a_decorator_given_its_name_positionally_says_to_pass_it_by_keyword():
    """Item 10: ``@activity("myapp:x/y.z")`` would register the string as the function."""
    with pytest.raises(RegistrationError, match=r"write `@activity\(name=\"myapp:x/y.z\"\)`"):
        activity("myapp:x/y.z")


# ---------------------------------------------------------------------------------------------
# Item 10: a worker whose component modules cannot be loaded says so in one line
# ---------------------------------------------------------------------------------------------

BAD_DECORATOR_MODULE = """
from workers import workflow


@workflow
def order(customer: str) -> str:
    return customer
"""


def start_worker(modules: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="obelisk_site.settings",
        OBELISK_COMPONENT_MODULES=modules,
        DATABASE_URL=current_database_url(),
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(BASE_DIR)]),
    )
    return subprocess.run(
        [sys.executable, "manage.py", "obelisk_worker", "--workers", "1"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_a_worker_started_with_a_module_that_does_not_exist_exits_with_one_line(tmp_path):
    """Item 10: a typo in ``OBELISK_COMPONENT_MODULES`` used to end the worker with a 30-line
    traceback. It exits non-zero with one line that names the module and the setting."""
    done = start_worker("tests.support.components,tests.no_such_module", tmp_path)
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout + done.stderr
    assert "Traceback" not in lines[0]
    assert "`tests.no_such_module`" in lines[0] and "OBELISK_COMPONENT_MODULES" in lines[0]


def test_a_worker_started_with_a_decorator_mistake_exits_with_one_line_saying_what_to_write(tmp_path):
    """Item 10: a component module with ``@workflow def order(customer: str)`` stops the
    worker at start, in one line that says what to write."""
    (tmp_path / "h4_badflows.py").write_text(textwrap.dedent(BAD_DECORATOR_MODULE))
    done = start_worker("h4_badflows", tmp_path)
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout + done.stderr
    assert "write `def order(ctx, customer: str)`" in lines[0]
    assert "h4_badflows.py" in lines[0], "the line says where the function is"


# ---------------------------------------------------------------------------------------------
# Items 8 and 9 in a real worker cluster
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_fails_an_undecorated_call_and_a_local_clock_at_once(django_db_setup, request, tmp_path):
    """Items 8 and 9 through ``obelisk_worker``: the workflow calling a plain function and the
    one reading the clock through a local import both finish failed in their first run,
    each with its clear reason; neither hangs nor finishes ok."""
    modules = "tests.support.components,tests.support.workflow_components"
    with started_clusters(request, tmp_path, default_env={"OBELISK_COMPONENT_MODULES": modules}) as start:
        start(1)
        undecorated, _ = submit(wfc.calls_undecorated.ffqn, [3])
        clock, _ = submit(wfc.local_clock.ffqn, [])
        found = wait_for_outcomes([undecorated, clock], timeout=60)
    name = "tests.support.workflow_components.undecorated_square"
    assert isinstance(found[undecorated], ExecutionFailure), found[undecorated]
    assert found[undecorated].reason == (
        f"error calling imported function {name} : `{name}` is not an activity or a workflow; "
        "decorate it with @activity (or @workflow) to call it from a workflow"
    )
    assert isinstance(found[clock], ExecutionFailure), found[clock]
    assert found[clock].reason == guard_reason("time.time()", "ctx.now()")
    for execution_id in (undecorated, clock):
        locks = [e for e in events(execution_id) if type(e).__name__ == "Locked"]
        assert len(locks) == 1, f"{execution_id} ran {len(locks)} times"
