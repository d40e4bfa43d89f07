"""Workflows: the pure replay core against fakes, the same scenarios through the store,
the workflow pool, whole workflows, real worker processes, and authoring mistakes."""
