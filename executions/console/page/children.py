"""The execution page's children: the execution's tree, depth-first, each child with its
outcome, reason and duration (or how long it has run so far), indented by depth.

The tree is one read of ``store.get_tree`` (a range of the primary key's pattern index, D128:
a child's id extends its parent's), so a workflow with many children costs one query.

why: D90 (links with ids as they are), D94 (the tree is an index range)
"""

from __future__ import annotations

from executions import display, store
from executions.console.urls import execution_url


def child_duration(child, now) -> str:
    """How long a child took, or has taken so far."""
    if child.is_finished:
        return display.format_duration(child.pending_expires_finished - child.created_at)
    return display.format_duration(now - child.created_at) + " so far"


def children(execution_id: str, now) -> list[dict]:
    """The children, depth-first, each with its outcome, reason and duration."""
    tree = []
    for child, child_retval in store.get_tree(execution_id)[1:]:
        depth = child.execution_id.count(".") - execution_id.count(".")
        outcome = child.outcome(now)
        tree.append(
            {
                "id": child.execution_id,
                "short": child.execution_id[len(execution_id) + 1 :],
                "url": execution_url(child.execution_id),
                "ffqn": child.ffqn,
                "outcome": outcome,
                "badge": display.outcome_badge(outcome),
                "reason": display.short_reason(child_retval, 80),
                "duration": child_duration(child, now),
                "indent": (depth - 1) * 1.5,
            }
        )
    return tree
