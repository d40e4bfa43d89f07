"""``/health``: the one route open without credentials, for load balancers and probes.

200 while the database answers, with the backlog (executions due and not yet claimed) and
how many worker clusters report in; 503 when it does not. It says nothing a stranger could
use: counts only, no hostnames or ids.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from ninja import Router, Status

from executions import store
from obelisk_api.errors import body
from obelisk_api.schemas import ErrorOut, HealthOut

router = Router(tags=["health"])
logger = logging.getLogger("obelisk.api")


@router.get("/health", auth=None, response={200: HealthOut, 503: ErrorOut})
def health(request):
    try:
        backlog = sum(store.backlog().values())
        clusters = store.list_clusters()
    except DatabaseError as error:
        logger.warning("health: database unavailable: %s", error)
        return Status(503, body("database_unavailable", "the database cannot be reached"))
    return {
        "status": "ok",
        "database": True,
        "backlog": backlog,
        "clusters_alive": sum(1 for cluster in clusters if cluster.alive),
        "clusters_known": len(clusters),
    }
