"""Workers: the authoring API, executors, the timer sweep and the django-q2 glue.

The authoring API imports no worker runtime and no Django (safe to import anywhere)::

    from workers import activity, ActivityError, current_activity, schedule, webhook, workflow
"""

from workers.activity import ActivityError, activity, current_activity
from workers.scheduling import schedule
from workers.webhooks import webhook
from workers.workflow import WorkflowContext, workflow

__all__ = ["activity", "ActivityError", "current_activity", "schedule", "webhook", "workflow", "WorkflowContext"]
