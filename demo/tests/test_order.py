"""README's ``order`` workflow tested as README, "Testing your workflows", shows: the payment
stubbed, the 5-minute sleep skipped, a child failure, and a replay of an exported history
kept in ``histories/`` (a change to ``order`` that would break in-flight executions fails
here before it is deployed)."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from demo.tests.shop import charge, order, reserve
from workers import ActivityError
from workers.testing import replay

HISTORY = Path(__file__).parent / "histories" / "order.history.json"
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def test_an_order_is_reserved_and_charged_after_five_minutes(obelisk_env):
    run = obelisk_env.run(order, "ada", ["book", "pen"], activities={charge: {"charged": 500}}, now=START)
    assert sorted(run.value["reserved"]) == ["book reserved for ada", "pen reserved for ada"]
    assert run.value["receipt"] == {"charged": 500}
    assert run.value["at"] == (START + timedelta(minutes=5)).isoformat()  # the sleep took no time
    assert [call.args for call in run.calls_of(charge)] == [("ada", 500)]
    assert len(run.calls_of(reserve)) == 2  # the real activity, run in-process


def test_a_declined_card_is_the_orders_answer(obelisk_env):
    declined = ActivityError({"reason": "card declined"}, retryable=False)
    run = obelisk_env.run(order, "ada", ["book"], activities={charge: declined})
    assert "card declined" in run.value["charge_failed"]


def test_a_flaky_provider_is_retried(obelisk_env):
    run = obelisk_env.run(
        order, "ada", ["book"], activities={charge: obelisk_env.sequence(ConnectionError(), {"charged": 500})}
    )
    assert run.value["receipt"] == {"charged": 500}
    assert [call.attempt for call in run.calls_of(charge)] == [1, 2]


def test_the_exported_history_still_replays():
    """``histories/order.history.json``: ``obelisk_status <id> --export`` of a real order."""
    assert replay(order, HISTORY).clean
