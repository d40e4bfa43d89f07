"""The benchmark's activity: does nothing, so the engine's own cost is what is measured."""

from workers import activity


@activity(name="bench:noop/ifc.noop")
def noop() -> None:
    return None
