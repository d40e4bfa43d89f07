"""The execution page's logs and backtraces: log lines and std stream chunks grouped by
run, and the workflow's backtraces with the versions each was written for, each frame with
its source lines from the stored files when they are stored (``code``).

At most ``MAX_LOGS`` entries are read; as of a version, only the logs written by then and
the backtraces from versions up to it.

why: D41 (logs and backtraces), D111
"""

from __future__ import annotations

from collections import OrderedDict

from executions import display, store
from executions.console.page.code import digest_at, frames_with_source

MAX_LOGS = 2000


def logs_and_backtraces(execution_id: str, as_of, events) -> dict:
    """Logs grouped by run, and the workflow's backtraces; as of then when time-travelling.
    ``events``: the execution's log, which says the component digest of each backtrace."""
    logs = store.list_logs(execution_id, limit=MAX_LOGS)
    if as_of is not None:
        logs = [entry for entry in logs if entry.created_at <= as_of.at]
    runs: OrderedDict[str, list] = OrderedDict()
    for entry in logs:
        text = entry.message if entry.message is not None else (entry.payload or b"").decode("utf-8", "replace")
        runs.setdefault(entry.run_id, []).append(
            {"at": display.exact_time(entry.created_at), "what": entry.level or entry.stream, "text": text}
        )
    files: dict = {}
    backtraces = [
        {"from": low, "to": high, "frames": frames_with_source(frames, digest_at(events, low), files)}
        for low, high, frames in store.list_backtraces(execution_id)
        if as_of is None or low <= as_of.version
    ]
    return {"runs": runs, "backtraces": backtraces}
