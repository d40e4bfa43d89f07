"""The execution page's view of the code an execution runs: whether a live cluster serves it
("waiting for component sha256:… (not served)", near the outcome), and the source lines of
its backtrace's frames read from the deployment's stored files.

An execution runs only on the code of its component digest (D111): a due one whose digest
no live cluster serves says so (``store.waiting_for_code``); while no cluster
is alive at all nothing is said, as on the dashboard (every due execution waits then). A
frame's file is looked up among the files stored for the component digest the execution
was pinned to when the backtrace was written (``Created``, a ``Locked`` or an upgrade before
it), through the frame mapping (``store.resolve_source_digest``); a frame whose file is not
stored shows the line the worker read when it wrote the backtrace, as before.
why: D41 (backtraces), D111.
"""

from __future__ import annotations

from dataclasses import dataclass

from executions import store
from executions.events import ComponentUpgradeFinished, Created, Locked

CONTEXT_LINES = 2  # lines shown before and after a frame's line


@dataclass(frozen=True)
class Frame:
    """One frame of a backtrace: where, and its source (``lines``: ``(number, text, is_the_line)``
    from the stored file, else empty and ``code`` is what the worker read)."""

    file: str
    line: int
    function: str
    code: str
    stored_blob: str | None = None  # the t_file digest the lines come from
    lines: tuple[tuple[int, str, bool], ...] = ()

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def digest_at(events, version: int) -> str | None:
    """The component digest the execution was pinned to at ``version``: the last of its
    ``Created``, ``Locked`` or successful upgrade at or before it."""
    digest = None
    for record in events:
        if record.version > version:
            break
        event = record.event
        if isinstance(event, (Created, Locked)):
            digest = event.component_id.component_digest
        elif isinstance(event, ComponentUpgradeFinished) and event.succeeded:
            digest = event.component_digest
    return digest


def frames_with_source(frames: list[dict], digest: str | None, files: dict) -> list[Frame]:
    """The frames, each with its lines from the stored file when it is stored. ``files``
    caches the decoded files by blob digest across the page's backtraces."""
    return [_frame(raw, digest, files) for raw in frames]


def _frame(raw: dict, digest: str | None, files: dict) -> Frame:
    file, line = str(raw.get("file", "?")), int(raw.get("line") or 0)
    frame = Frame(file, line, str(raw.get("function", "?")), str(raw.get("code") or ""))
    blob = store.resolve_source_digest(digest, file) if digest and line > 0 else None
    if blob is None:
        return frame
    if blob not in files:
        content = store.read_file(blob)
        files[blob] = None if content is None else content.decode("utf-8", "replace").splitlines()
    text = files[blob]
    if not text or line > len(text):
        return frame
    first, last = max(1, line - CONTEXT_LINES), min(len(text), line + CONTEXT_LINES)
    lines = tuple((number, text[number - 1], number == line) for number in range(first, last + 1))
    return Frame(frame.file, line, frame.function, text[line - 1].strip(), blob, lines)
