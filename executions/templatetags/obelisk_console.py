"""Template tags of the operator console: ``{% obelisk_dashboard %}`` on the admin index.

The dashboard (``obelisk/dashboard.html``) shows what ``store.dashboard()`` reads: the
executions by state and outcome, what finished and failed in the last hour, the oldest due
execution, expired locks, the due executions waiting for code no live cluster serves (by
component digest, D111), and the worker clusters with their heartbeats. Only users who
may view executions see it; the numbers are read once per page view and again every
``POLL_SECONDS`` while the page is open (a handful of index-served queries,
``executions/store/dashboard.py``; the poll is ``obelisk/poll.html``'s).

Each card links to the list filtered to what it counts (D93): the same outcome, the same
window ("finished: last hour"), and children too, since the counts include them.

why: D92 (the poll), D93 (index ranges, exact last hour), D95 (reads without JIT), D111
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django import template
from django.urls import NoReverseMatch, reverse

from executions import display, store
from executions.console.limits import without_jit
from executions.outcome import FAILURE_OUTCOMES, FINISHED_OUTCOMES, UNFINISHED_OUTCOMES

register = template.Library()

VIEW_PERMISSION = "obelisk_executions.view_executionstate"
LIVE = ("pending", "scheduled", "running", "paused", "cancelling")
POLL_SECONDS = 10  # how often an open dashboard re-reads its numbers


def _url(name: str, *args) -> str | None:
    try:
        return reverse(name, args=list(args))  # ids as they are, copyable (D90)
    except NoReverseMatch:
        return None


def _list_link(**query: str) -> str | None:
    """The executions list filtered by ``query``, children included (every count is)."""
    changelist = _url("admin:obelisk_executions_executionstate_changelist")
    if changelist is None:
        return None
    return f"{changelist}?{urlencode({**query, 'top_level': 'all'})}"


def _outcome_link(outcome: str) -> str | None:
    return _list_link(outcome=outcome)


@register.inclusion_tag("obelisk/dashboard.html", takes_context=True)
def obelisk_dashboard(context):
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.has_perm(VIEW_PERMISSION):
        return {"visible": False}
    with without_jit():  # (D95)
        data = store.dashboard()
    return {
        "visible": True,
        "data": data,
        "live": [{"name": name, "count": data.live.get(name, 0), "url": _outcome_link(name)} for name in LIVE],
        "outcomes": _outcome_cards(data),
        "states": sorted(data.by_state.items()),
        "oldest": _oldest_due(data),
        "not_served": _not_served(data),
        "not_served_total": sum(data.not_served.values()),
        "clusters": _clusters(data),
        "alive_clusters": sum(1 for c in data.clusters if c.alive),
        "failed_url": _list_link(outcome="failed", finished="1h"),
        "errors_url": _list_link(outcome="error", finished="1h"),
        "finished_url": _list_link(finished="1h"),
        "running_url": _outcome_link("running"),
        "poll_seconds": POLL_SECONDS,
    }


def _outcome_cards(data) -> list[dict]:
    """One card per outcome that has executions, failures marked."""
    return [
        {
            "name": name,
            "count": data.by_outcome.get(name, 0),
            "url": _outcome_link(name),
            "failure": name in FAILURE_OUTCOMES or name == "error",
        }
        for name in (*FINISHED_OUTCOMES, *UNFINISHED_OUTCOMES)
        if data.by_outcome.get(name)
    ]


def _oldest_due(data) -> dict | None:
    """The execution that has waited longest for a worker, if any."""
    oldest = data.oldest_pending
    if oldest is None:
        return None
    return {
        "execution_id": oldest.execution_id,
        "ffqn": oldest.ffqn,
        "due_at": oldest.due_at,
        "age": display.format_duration(oldest.age),
        "url": _url("admin:obelisk_executions_executionstate_change", oldest.execution_id),
    }


def _not_served(data) -> list[dict]:
    """The component digests due executions wait for and no live cluster serves, most
    waiting first, each linking to the list of that component's executions."""
    return [
        {"digest": digest, "count": count, "url": _list_link(component=digest)}
        for digest, count in sorted(data.not_served.items(), key=lambda item: (-item[1], item[0]))
    ]


def _clusters(data) -> list[dict]:
    """The worker clusters with their heartbeats: seen how long ago, up for how long."""
    now = data.now
    return [
        {
            "info": info,
            "seen_ago": display.format_duration(max(timedelta(0), now - info.last_seen_at)),
            "up_for": display.format_duration(max(timedelta(0), (info.stopped_at or now) - info.started_at)),
            "deployment_url": _url("admin:obelisk_deployments_deployment_change", info.deployment_id),
            "status": "alive" if info.alive else ("stopped" if info.stopped_at else "gone"),
        }
        for info in data.clusters
    ]
