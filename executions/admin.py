"""Django's admin autodiscovery imports this module: it registers the operator console's
pages of the ``executions`` app, which live in ``executions.console``.

- ``ExecutionState``: the executions list and the execution page
  (``executions.console.execution_admin``);
- ``AuditEntry``: the audit trail across executions (``executions.console.audit``);
- ``Delay`` and ``LogEntry``: plain read-only lists (``executions.console.delays_and_logs``).

The deployments app registers its own pages (``deployments.admin``) on the same read-only
base, ``executions.console.readonly``.

why: D90, D91
"""

from __future__ import annotations

from executions.console import (  # noqa: F401  (each registers its pages)
    audit,
    delays_and_logs,
    execution_admin,
    schedules,
    webhook_calls,
)
