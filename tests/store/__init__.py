"""The store: ids, the state table, the conformance of every operation to spec 000 by
section, the model-based test, fencing, races, retention, retries and bad input."""
