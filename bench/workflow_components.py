"""The workflow benchmark's workflows (``bench/workflows.py``), each in both blocking strategies.

The children are the no-op activity of ``bench.components``, so what is measured is the
engine's own cost per child: recording the call, creating the child, claiming and running
it, delivering its response, and waking (Await) or replaying (Interrupt) the parent.
"""

from bench.components import noop
from workers import workflow


def _sequential(ctx, n: int) -> int:
    """Obelisk's "fibo" shape: ``n`` direct calls one after another."""
    for _ in range(n):
        ctx.call(noop)
    return n


def _parallel(ctx, n: int) -> int:
    """``n`` children submitted to one join set, then every response awaited."""
    with ctx.join_set() as js:
        for _ in range(n):
            js.submit(noop)
        for _ in range(n):
            js.await_next(noop)
    return n


def _recorded_calls(ctx, n: int) -> int:
    """``n`` cheap recorded host calls (one ``Persist`` event each): a history of ``n``
    events whose replay costs only the replay core."""
    total = 0
    for _ in range(n):
        total += ctx.random_u64(0, 1000)
    return total


@workflow(name="bench:wf/ifc.sequential-await", blocking="await")
def sequential_await(ctx, n: int) -> int:
    return _sequential(ctx, n)


@workflow(name="bench:wf/ifc.sequential-interrupt", blocking="interrupt")
def sequential_interrupt(ctx, n: int) -> int:
    return _sequential(ctx, n)


@workflow(name="bench:wf/ifc.parallel-await", blocking="await")
def parallel_await(ctx, n: int) -> int:
    return _parallel(ctx, n)


@workflow(name="bench:wf/ifc.parallel-interrupt", blocking="interrupt")
def parallel_interrupt(ctx, n: int) -> int:
    return _parallel(ctx, n)


@workflow(name="bench:wf/ifc.recorded-calls", blocking="await")
def recorded_calls(ctx, n: int) -> int:
    return _recorded_calls(ctx, n)
