"""A sample workflow for the demo (``scripts/demo.sh``): fan-out in a join set, a durable
delay, and a child workflow, replayed from the log on every run."""

from datetime import timedelta

from demo.activities import greet
from workers import workflow


@workflow
def welcome_team(ctx, names: list[str]) -> dict:
    """Greets everyone in parallel, waits a moment (a durable timer), then asks a child
    workflow for a summary."""
    with ctx.join_set() as js:
        for name in names:
            js.submit(greet, name)
        greetings = sorted(js.await_next(greet)[1].value for _ in names)
    ctx.log.info("greeted %d people; sleeping on a durable timer", len(greetings))
    ctx.sleep(timedelta(seconds=1))
    summary = ctx.call(summarize, greetings)
    return {"greetings": greetings, "summary": summary}


@workflow
def summarize(ctx, greetings: list[str]) -> str:
    """A child workflow: one activity call."""
    first = ctx.call(greet, "everyone")
    return f"{first} ({len(greetings)} personal greetings sent)"
