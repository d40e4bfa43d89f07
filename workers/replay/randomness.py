"""Randomness and durable values (spec/README.md decision 4; spec 002 §1.2, §2.13 with the
Q10 off-by-one fixed).

``DeterministicRandom`` draws the run's random values and the ids of scheduled executions
from a seed of the execution id, so a replay draws the same ones. ``decode_persisted`` reads
a recorded ``Persist`` back (a random number, a random string, a durable now). Used by
``workers.replay.cursor`` and ``workers.replay.history``.

why: spec/README.md decision 4.
"""

from __future__ import annotations

import random
import string
from datetime import datetime

from executions.events import Persist


class DeterministicRandom:
    """``random.Random`` seeded with ``ExecutionId.random_seed()``, re-seeded every run. Draws
    use only ``getrandbits`` (stable across Python versions) with rejection sampling. Every draw
    is recorded: random values as ``Persist``, schedule ids inside ``Schedule``."""

    ALPHABET = string.ascii_letters + string.digits
    CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def between(self, low: int, high: int) -> int:
        """Uniform in ``[low, high]``, both inclusive."""
        span = high - low + 1
        bits = span.bit_length()
        while True:
            draw = self._rng.getrandbits(bits)
            if draw < span:
                return low + draw

    def text(self, length: int) -> str:
        return "".join(self.ALPHABET[self.between(0, len(self.ALPHABET) - 1)] for _ in range(length))

    def ulid_randomness(self) -> str:
        """The 80 random bits of a ULID, as 16 Crockford base-32 characters."""
        bits = self._rng.getrandbits(80)
        return "".join(self.CROCKFORD[(bits >> shift) & 31] for shift in range(75, -1, -5))


U64_MAX = 2**64 - 1
NOW_KIND = {"type": "now"}


def decode_persisted(event: Persist) -> int | str | datetime:
    raw = bytes(event.value)
    match event.kind.get("type"):
        case "random_u64":
            return int.from_bytes(raw, "big")
        case "now":
            return datetime.fromisoformat(raw.decode())
    return raw.decode()
