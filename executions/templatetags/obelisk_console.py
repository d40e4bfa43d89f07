"""Template tags of the operator console: ``{% obelisk_dashboard %}`` on the admin index.

The dashboard (``obelisk/dashboard.html``) shows what ``store.dashboard()`` reads: the
executions by state and outcome, what finished and failed in the last hour, the oldest due
execution, expired locks, and the worker clusters with their heartbeats. Only users who
may view executions see it; the numbers are read once per page view and again every
``POLL_SECONDS`` while the page is open (a handful of index-served queries,
``executions/store/dashboard.py``; the poll is ``obelisk/poll.html``'s).

Each card links to the list filtered to what it counts (D93): the same outcome, the same
window ("finished: last hour"), and children too, since the counts include them.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django import template
from django.urls import NoReverseMatch, reverse

from executions import display, store
from executions.admin_filters import without_jit
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
    now = data.now
    live = [{"name": name, "count": data.live.get(name, 0), "url": _outcome_link(name)} for name in LIVE]
    outcomes = [
        {
            "name": name,
            "count": data.by_outcome.get(name, 0),
            "url": _outcome_link(name),
            "failure": name in FAILURE_OUTCOMES or name == "error",
        }
        for name in (*FINISHED_OUTCOMES, *UNFINISHED_OUTCOMES)
        if data.by_outcome.get(name)
    ]
    oldest = None
    if data.oldest_pending is not None:
        oldest = {
            "execution_id": data.oldest_pending.execution_id,
            "ffqn": data.oldest_pending.ffqn,
            "due_at": data.oldest_pending.due_at,
            "age": display.format_duration(data.oldest_pending.age),
            "url": _url("admin:obelisk_executions_executionstate_change", data.oldest_pending.execution_id),
        }
    clusters = [
        {
            "info": info,
            "seen_ago": display.format_duration(max(timedelta(0), now - info.last_seen_at)),
            "up_for": display.format_duration(max(timedelta(0), (info.stopped_at or now) - info.started_at)),
            "deployment_url": _url("admin:obelisk_deployments_deployment_change", info.deployment_id),
            "status": "alive" if info.alive else ("stopped" if info.stopped_at else "gone"),
        }
        for info in data.clusters
    ]
    return {
        "visible": True,
        "data": data,
        "live": live,
        "outcomes": outcomes,
        "states": sorted(data.by_state.items()),
        "oldest": oldest,
        "clusters": clusters,
        "alive_clusters": sum(1 for c in data.clusters if c.alive),
        "failed_url": _list_link(outcome="failed", finished="1h"),
        "errors_url": _list_link(outcome="error", finished="1h"),
        "finished_url": _list_link(finished="1h"),
        "running_url": _outcome_link("running"),
        "poll_seconds": POLL_SECONDS,
    }
