"""README's ``order`` workflow and its activities, as "Writing activities" and "Writing
workflows" show them (here with a 5-minute sleep), tested in ``test_order.py``
(README, "Testing your workflows"). No ``from __future__ import annotations``: the
registry reads the annotations as types."""

from datetime import timedelta

from workers import ActivityError, activity, workflow
from workers.workflow import ChildFailed


@activity(max_retries=3, backoff=timedelta(seconds=1), timeout=timedelta(seconds=30))
def charge(customer_id: str, cents: int) -> dict:
    if cents <= 0:
        raise ActivityError({"reason": "amount must be positive"}, retryable=False)
    raise ConnectionError("the payment provider is not reachable from here: stub `charge` in tests")


@activity
def reserve(customer_id: str, item: str) -> str:
    return f"{item} reserved for {customer_id}"


@workflow
def order(ctx, customer: str, items: list[str]) -> dict:
    with ctx.join_set() as js:
        for item in items:
            js.submit(reserve, customer, item)
        reserved = [js.await_next(reserve)[1].value for _ in items]
    ctx.sleep(timedelta(minutes=5))
    try:
        receipt = ctx.call(charge, customer, 500)
    except ChildFailed as failure:
        return {"reserved": reserved, "charge_failed": str(failure.retval)}
    return {"reserved": reserved, "receipt": receipt, "at": ctx.now().isoformat()}
