"""Workflows and activities of the workflow tests through the store
(``tests/workflows/test_replay_in_store_*.py``, ``test_workflow_pool.py``,
``test_whole_workflows.py``, ``test_authoring_errors.py``).

Everything here is registered under ``test:wf/...``. Activities are run by the test's
``World`` (in the test process, locked and finished through the store); workflows by
``workers.workflow_runner.run_workflow``, as the executor does.

This module is a workflow module, so ``@workflow`` guards its names (``workers.
determinism``): ``time``, ``random``, ``uuid``, ``os`` and ``datetime`` below are the guarded
stand-ins. They raise only inside a running workflow, so the activities of this very module
use them freely (``impure_values``). No ``from __future__ import annotations``: the registry
reads the annotations as types.
"""

import datetime as dt
import logging
import os
import random
import secrets
import threading
import time
import uuid
from datetime import datetime, timedelta
from random import randint
from uuid import uuid4

from workers import ActivityError, activity, workflow
from workers.workflow import AllProcessed, ChildFailed, FunctionMismatch

# ---------------------------------------------------------------------------------------------
# Activities
# ---------------------------------------------------------------------------------------------


@activity(name="test:wf/acts.fn1", max_retries=0)
def fn1(x: int = 0) -> int:
    """Doubles even numbers; an odd number is an error value."""
    if x % 2:
        raise ActivityError(x, retryable=False)
    return x * 2


@activity(name="test:wf/acts.fn2", max_retries=0)
def fn2(x: int = 0) -> int:
    return x


@activity(name="test:wf/acts.pair", max_retries=0)
def pair(x: int) -> tuple[int, str]:
    return x, str(x)


@activity(name="test:wf/acts.fail", max_retries=0)
def fail(code: str) -> int:
    raise ActivityError({"code": code}, retryable=False)


@activity(name="test:wf/acts.crash", max_retries=0)
def crash() -> int:
    raise RuntimeError("the activity crashed")


@activity(name="test:wf/acts.hang", max_retries=0, lock_duration=timedelta(seconds=2))
def hang() -> str:
    """The World never runs it on its own: the test times it out, cancels it or leaves it."""
    return "never run"


@activity(name="test:wf/acts.impure", max_retries=0)
def impure_values() -> dict:
    """What a workflow may not call, called from an activity of the same (guarded) module."""
    return {
        "time": time.time(),
        "random": random.random(),
        "uuid": str(uuid.uuid4()),
        "now": datetime.now().isoformat(),
        "urandom": os.urandom(4).hex(),
    }


# ---------------------------------------------------------------------------------------------
# Workflows
# ---------------------------------------------------------------------------------------------

LOCK = timedelta(seconds=2)  # short: an Await wait nobody answers ends after ~1.6 s


@workflow(name="test:wf/flows.driven", lock_duration=LOCK)
def driven(ctx) -> None:
    """The root of executions whose runs a test drives host call by host call."""


@workflow(name="test:wf/flows.fan-out", lock_duration=LOCK)
def fan_out(ctx, xs: list[int]) -> dict:
    """A join set of activities awaited in completion order, a sleep, a direct call."""
    with ctx.join_set() as js:
        for x in xs:
            js.submit(fn2, x)
        values = sorted(js.await_next(fn2)[1].value for _ in xs)
    slept_until = ctx.sleep(timedelta(milliseconds=1))
    doubled = ctx.call(fn1, sum(values))
    return {"values": values, "doubled": doubled, "slept_until": slept_until.isoformat()}


@workflow(name="test:wf/flows.sequential-sum", lock_duration=LOCK)
def sequential_sum(ctx, n: int) -> int:
    """``n`` direct calls one after another (Obelisk's "fibo" shape)."""
    return sum(ctx.call(fn2, i) for i in range(1, n + 1))


STARTS: list[str] = []  # the execution of every run that started ``counted_calls`` (a side channel)


@workflow(name="test:wf/flows.counted-calls", lock_duration=LOCK)
def counted_calls(ctx, n: int) -> int:
    """``n`` direct calls, noting every start of the function (a parked run goes on where
    it was, a new run starts it again and replays) and logging every step."""
    STARTS.append(ctx.execution_id)
    total = 0
    for i in range(1, n + 1):
        total += ctx.call(fn2, i)
        ctx.log.info("step %d", i)
    return total


CAUGHT: list[str] = []  # what ``catches_everything`` caught, by execution (a side channel)


@workflow(name="test:wf/flows.catches-everything", lock_duration=LOCK)
def catches_everything(ctx, x: int) -> int:
    """A direct call inside ``except Exception``: the engine's own failures must never land
    here (they are signals a workflow cannot swallow)."""
    try:
        return ctx.call(fn2, x)
    except Exception as error:
        CAUGHT.append(f"{ctx.execution_id}: {type(error).__name__}")
        return -1


@workflow(name="test:wf/flows.child", lock_duration=LOCK)
def child_workflow(ctx, x: int) -> int:
    return ctx.call(fn2, x) + 1


@workflow(name="test:wf/flows.leaves-a-child", lock_duration=LOCK)
def leaves_a_child(ctx, x: int) -> int:
    """Submits a child workflow it never awaits, then makes a direct call and returns:
    closing the join set at the end waits for the child (§5.1)."""
    js = ctx.join_set()
    js.submit(child_workflow, x)
    return ctx.call(fn2, x)


@workflow(name="test:wf/flows.two-children", lock_duration=LOCK)
def two_children(ctx, x: int) -> int:
    """Two children in one join set, then two join-nexts: when both responses are in by
    the first wait's end, the second join-next has its response in hand."""
    with ctx.join_set() as js:
        js.submit(fn2, x)
        js.submit(fn2, x + 1)
        return js.await_next(fn2)[1].value + js.await_next(fn2)[1].value


@workflow(name="test:wf/flows.failing-child", lock_duration=LOCK)
def failing_child(ctx, x: int) -> int:
    raise ValueError(f"child trap {x}")


RAN_ON: list[int] = []  # the thread of every run of ``where_it_ran`` (a side channel)


@workflow(name="test:wf/flows.where-it-ran", lock_duration=LOCK)
def where_it_ran(ctx, x: int) -> int:
    """Notes the thread its run ran on (the workflow pool's tests)."""
    RAN_ON.append(threading.get_ident())
    return x


DRAWS: list[dict] = []  # what every run of ``draws`` computed (a side channel for the test)


@workflow(name="test:wf/flows.draws", lock_duration=LOCK)
def draws(ctx) -> dict:
    """Random values, a uuid and the time, then a wait (so a later run replays them)."""
    values = {
        "u64": ctx.random_u64(0, 2**64 - 1),
        "string": ctx.random_string(5, 20),
        "uuid": str(ctx.uuid()),
        "now": ctx.now().isoformat(),
    }
    DRAWS.append(dict(values))
    values["child"] = ctx.call(fn2, 7)
    values["after"] = ctx.random_u64(0, 1000)
    DRAWS.append(dict(values))
    return values


@workflow(name="test:wf/flows.forbidden", lock_duration=LOCK)
def forbidden(ctx, what: str) -> str:
    """Calls one source of non-determinism directly (the guard must stop it)."""
    ctx.call(fn2, 1)  # some history first: the guard also holds in a replaying run
    calls = {
        "time.time": lambda: time.time(),
        "time.monotonic": lambda: time.monotonic(),
        "random.random": lambda: random.random(),
        "random.randint": lambda: random.randint(1, 6),
        "uuid.uuid4": lambda: uuid.uuid4(),
        "datetime.now": lambda: datetime.now(),
        "os.urandom": lambda: os.urandom(8),
        "secrets.token_hex": lambda: secrets.token_hex(4),
        "time.sleep": lambda: time.sleep(0.01),
        "from random import randint": lambda: randint(1, 6),
        "from uuid import uuid4": lambda: uuid4(),
        "import datetime as dt": lambda: dt.datetime.now(),
        "dt.date.today": lambda: dt.date.today(),
    }
    return repr(calls[what]())


@workflow(name="test:wf/flows.now-is-a-datetime", lock_duration=LOCK)
def now_is_a_datetime(ctx) -> list:
    """``from datetime import datetime`` in a workflow module: ``ctx.now()`` must still be
    a ``datetime`` for the code that checks."""
    now = ctx.now()
    return [isinstance(now, datetime), isinstance(now, dt.datetime), type(now).__name__]


@workflow(name="test:wf/flows.impure-activity", lock_duration=LOCK)
def calls_impure_activity(ctx) -> dict:
    return ctx.call(impure_values)


@workflow(name="test:wf/flows.trap", lock_duration=LOCK)
def trap(ctx, use_with: bool) -> None:
    """Starts an activity that never finishes on its own and a child workflow, then raises."""
    if use_with:
        with ctx.join_set() as js:
            js.submit(hang)
            js.submit(child_workflow, 4)
            raise RuntimeError("bug in the workflow")
    js = ctx.join_set()
    js.submit(hang)
    js.submit(child_workflow, 4)
    js.submit_delay(timedelta(hours=1))
    raise RuntimeError("bug in the workflow")


def _describe(retval) -> list:
    kind = getattr(retval, "kind", None)
    return [type(retval).__name__, kind if kind is not None else retval.value]


@workflow(name="test:wf/flows.child-outcomes", lock_duration=LOCK)
def child_outcomes(ctx) -> dict:
    """Each kind of child failure, as the parent sees it."""
    out: dict = {}
    for label, fn, args in (
        ("error_value", fail, ("E42",)),
        ("crashed", crash, ()),
        ("timed_out", "test:wf/acts.hang-timeout", ()),
        ("cancelled", "test:wf/acts.hang-cancel", ()),
        ("child_workflow_trap", failing_child, (5,)),
    ):
        try:
            ctx.call(fn, *args)
            out[label] = "returned"
        except ChildFailed as failed:
            out[label] = [*_describe(failed.retval), str(failed.child_id)]
    _, retval = ctx.invoke(fail, "E7", label="invoked")
    out["invoked"] = _describe(retval)
    value = ctx.call(pair, 3)
    out["typed_ok"] = [type(value).__name__, list(value)]
    with ctx.join_set() as js:
        child = js.submit(fn1, 3)
        out["join_next"] = list(js.join_next())
        out["get"] = _describe(ctx.get(fn1, child))
    return out


@activity(name="test:wf/acts.hang-timeout", max_retries=0, lock_duration=timedelta(seconds=2))
def hang_timeout() -> int:
    return 0


@activity(name="test:wf/acts.hang-cancel", max_retries=0)
def hang_cancel() -> int:
    return 0


# Nondeterminism: the code of ``changing`` depends on ``CODE_VERSION`` (a test flips it between
# runs, as a deployment of new code would). ``PLANS[case][version]`` is the list of host calls.
CODE_VERSION = "A"
PLANS: dict[str, dict[str, list[tuple]]] = {
    "call_order": {
        "A": [("join_set", None), ("submit", "fn1", 2), ("submit", "fn2", 3), ("join_next",)],
        "B": [("join_set", None), ("submit", "fn2", 3), ("submit", "fn1", 2), ("join_next",)],
    },
    "arguments": {
        "A": [("call", "fn1", 2)],
        "B": [("call", "fn1", 4)],
    },
    "removed_call": {
        "A": [("now",), ("call", "fn1", 2)],
        "B": [("call", "fn1", 2)],
    },
    "removed_trailing_call": {
        "A": [("call", "fn1", 2), ("call", "fn2", 3)],
        "B": [("call", "fn1", 2)],
    },
    "added_call_before": {
        "A": [("call", "fn1", 2)],
        "B": [("random", 0, 10), ("call", "fn1", 2)],
    },
    "join_set_name": {
        "A": [("join_set", "alpha"), ("submit", "fn1", 2), ("join_next",)],
        "B": [("join_set", "beta"), ("submit", "fn1", 2), ("join_next",)],
    },
    "await_function": {
        "A": [("join_set", None), ("submit", "fn1", 2), ("await_next", "fn1")],
        "B": [("join_set", None), ("submit", "fn1", 2), ("await_next", "fn2")],
    },
    "sleep_duration": {
        "A": [("sleep", 1)],
        "B": [("sleep", 2)],
    },
    "scheduled_function": {
        "A": [("schedule", "fn1", 2), ("call", "fn2", 1)],
        "B": [("schedule", "fn2", 2), ("call", "fn2", 1)],
    },
}
FUNCTIONS = {"fn1": fn1, "fn2": fn2}


@workflow(name="test:wf/flows.changing", blocking="interrupt", lock_duration=LOCK)
def changing(ctx, case: str) -> list:
    results: list = []
    join_set = None
    for step in PLANS[case][CODE_VERSION]:
        match step:
            case ("join_set", name):
                join_set = ctx.join_set(name)
            case ("submit", fn, arg):
                results.append(join_set.submit(FUNCTIONS[fn], arg))
            case ("submit_hang",):
                results.append(join_set.submit(hang))
            case ("join_next",):
                results.append(list(join_set.join_next()))
            case ("await_next", fn):
                try:
                    results.append(str(join_set.await_next(FUNCTIONS[fn])))
                except (FunctionMismatch, AllProcessed) as error:
                    results.append(type(error).__name__)
            case ("call", fn, arg):
                results.append(ctx.call(FUNCTIONS[fn], arg))
            case ("now",):
                results.append(ctx.now().isoformat())
            case ("random", low, high):
                results.append(ctx.random_u64(low, high))
            case ("sleep", seconds):
                results.append(ctx.sleep(timedelta(seconds=seconds)).isoformat())
            case ("schedule", fn, arg):
                results.append(ctx.schedule(FUNCTIONS[fn], arg, at=timedelta(hours=1)))
    return results


@activity(name="test:wf/acts.chatty")
def chatty(x: int) -> int:
    """Prints and logs a warning: both land in its run's log (t_log)."""
    print(f"printing {x}")
    logging.getLogger("tests.support.workflows").warning("warning about %s", x)
    return x


@workflow(name="test:wf/flows.talkative", lock_duration=LOCK)
def talkative(ctx, x: int) -> int:
    """Logs around a direct call; a replay logs the first line again, marked (replay)."""
    ctx.log.info("calling chatty with %s", x)
    value = ctx.call(chatty, x)
    ctx.log.info("chatty returned %s", value)
    return value


# ---------------------------------------------------------------------------------------------
# Authoring mistakes (issue 36, items 8 and 9; ``tests/workflows/test_authoring_errors.py``)
# ---------------------------------------------------------------------------------------------


def plain_double(x: int) -> int:
    """A plain function, never decorated: a workflow cannot call it as a child."""
    return x * 2


@workflow(name="test:wf/flows.calls-undecorated", lock_duration=LOCK)
def calls_undecorated(ctx, how: str) -> object:
    """Some history first (so a replaying run meets the mistake too), then a host call of a
    function that is not a registered activity or workflow."""
    ctx.call(fn2, 1)
    if how == "call":
        return ctx.call(plain_double, 2)
    if how == "submit":
        with ctx.join_set() as js:
            js.submit(plain_double, 2)
            return js.await_next(plain_double)[1].value
    if how == "schedule":
        return ctx.schedule(plain_double, 2)
    if how == "invoke":
        return ctx.invoke(plain_double, 2, label="twice")[0]
    if how == "caught":  # a programming error, not an outcome the workflow can swallow
        try:
            return ctx.call(plain_double, 2)
        except Exception:
            return "swallowed"
    if how == "unknown name":
        return ctx.call("test:wf/acts.no-such-function", 2)
    if how == "bad argument":
        return ctx.call(fn2, "not a number")
    raise ValueError(how)


@workflow(name="test:wf/flows.forbidden-local", lock_duration=LOCK)
def forbidden_local(ctx, what: str) -> str:
    """Each source of non-determinism reached through an import *inside* the workflow
    function (a local import), which the module's own names do not cover."""
    ctx.call(fn2, 1)  # some history first: the guard also holds in a replaying run
    if what == "import time":
        import time

        return repr(time.time())
    if what == "from time import time":
        from time import time

        return repr(time())
    if what == "from time import monotonic":
        from time import monotonic

        return repr(monotonic())
    if what == "import datetime as d":
        import datetime as d

        return repr(d.datetime.now())
    if what == "from datetime import datetime":
        from datetime import datetime

        return repr(datetime.now())
    if what == "from datetime import date":
        from datetime import date

        return repr(date.today())
    if what == "time.localtime()":
        import time

        return repr(time.localtime())
    if what == "time.strftime(format)":
        from time import strftime

        return strftime("%H:%M:%S")
    if what == "import random":
        import random

        return repr(random.random())
    if what == "random.Random()":
        import random

        return repr(random.Random().random())
    if what == "random.SystemRandom()":
        import random

        return repr(random.SystemRandom().random())
    if what == "os.urandom":
        import os

        return repr(os.urandom(8))
    if what == "from os import urandom":
        from os import urandom

        return repr(urandom(8))
    if what == "secrets.token_hex":
        import secrets

        return repr(secrets.token_hex(8))
    if what == "from secrets import token_bytes":
        from secrets import token_bytes

        return repr(token_bytes(8))
    if what == "uuid.uuid1":
        import uuid

        return repr(uuid.uuid1())
    if what == "uuid.uuid4":
        import uuid

        return repr(uuid.uuid4())
    raise ValueError(what)


@workflow(name="test:wf/flows.forbidden-seedless-random", lock_duration=LOCK)
def forbidden_seedless_random(ctx, what: str) -> str:
    """``random.Random()`` without a seed and ``uuid.uuid1()`` through the module's own names."""
    ctx.call(fn2, 1)
    if what == "random.Random()":
        return repr(random.Random().random())
    if what == "uuid.uuid1":
        return repr(uuid.uuid1())
    if what == "secrets.token_bytes":
        return repr(secrets.token_bytes(4))
    raise ValueError(what)


@workflow(name="test:wf/flows.deterministic-uses", lock_duration=LOCK)
def deterministic_uses(ctx) -> dict:
    """What stays allowed in workflow code: the deterministic parts of the guarded modules
    (local imports too), logging, and every host call (the engine's own code in this thread
    reads the clock, draws ids and writes the store)."""
    import datetime as d
    import logging as log
    import random as r
    import time as t
    import uuid as u

    log.getLogger("tests.support.workflows").info("a plain log line from workflow code")
    ctx.log.info("a replay-aware log line")
    value = ctx.call(fn2, 3)
    scheduled = ctx.schedule(fn2, 4, at=timedelta(hours=1))
    with ctx.join_set() as js:
        js.submit(fn1, 2)
        _, doubled = js.await_next(fn1)
    now = ctx.now()
    return {
        "value": value,
        "doubled": doubled.value,
        "scheduled": scheduled.startswith("E_"),
        "seeded": r.Random(7).randint(0, 10**6) == r.Random(7).randint(0, 10**6),
        "later": (d.datetime(2020, 1, 1) + d.timedelta(days=1)).isoformat(),
        "is_datetime": isinstance(now, d.datetime),
        "formatted": t.strftime("%Y", now.timetuple()),
        "uuid": str(u.UUID(int=5)),
    }
