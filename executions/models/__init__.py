"""The store's tables, mirroring Obelisk's (spec 000 §2): one module per group.

- ``base``: exact JSON text and the read-only default managers every table shares;
- ``executions``: state, the append-only log, responses, delays, logs, backtraces, audit,
  cluster heartbeats;
- ``triggers``: schedules and their ticks, webhook keys and calls;
- ``deployments``: deployments, components, their metadata and files (``app_label``
  ``obelisk_deployments``).

Only ``executions.store`` writes them. Differences from the seed, all deliberate
(``docs/decisions.md``): surrogate ``id`` keys where the seed has composite keys (the admin
and foreign keys need a single column), foreign keys from every per-execution table to
``t_state`` (checked by the database except on the two hot append-only tables, D75), check
constraints for the state/lifecycle combinations of spec 000 §4, component digests stored as
``sha256:<hex>`` text, ``lock_generation`` for fencing (spec 004 §5.1) and
``consumes_response`` for join-next counting (decision 9).
"""

from executions.models.base import *  # noqa: F403
from executions.models.deployments import *  # noqa: F403
from executions.models.executions import *  # noqa: F403
from executions.models.triggers import *  # noqa: F403
