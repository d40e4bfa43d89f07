"""Workers: the activity authoring API, executors, the timer sweep and the django-q2 glue.

Authoring API (safe to import before Django is set up)::

    from workers import activity, ActivityError, current_activity
"""

from workers.registry import ActivityError, activity


def current_activity():
    """The running activity's context (execution id, attempt, deadline)."""
    from workers.runner import current_activity as current

    return current()


__all__ = ["activity", "ActivityError", "current_activity"]
