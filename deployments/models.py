"""The deployment tables, for Django's app registry: they are defined with the store's
tables (``executions/models/deployments.py``, D109) and belong to this app (``app_label``
``obelisk_deployments``). Django creates an app's content types and permissions only when
the app has a models module, so this one names them."""

from executions.models.deployments import *  # noqa: F403
