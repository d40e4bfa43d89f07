"""Identifiers in Obelisk's formats, parsed and validated in one place (spec 000 §1).

- ``E_<ULID>``: a top-level execution.
- ``E_<ULID>.<kind>:<name>_<idx>``: a child started in join set ``<kind>:<name>`` of its
  parent; deeper levels append more ``.<kind>:<name>_<idx>`` segments.
- ``Delay_<ULID>[.<segments of the owner>].<kind>:<name>_<idx>``: a durable timer of the
  owning execution.
- ``<kind>:<name>``: a join set; kind ``o`` (one-off), ``n`` (named) or ``g`` (generated).
- ``Run_<ULID>``, ``Exr_<ULID>``, ``Dep_<ULID>``: a run (one lock), an executor, a deployment.
- ``namespace:pkg/ifc.fn`` (optionally ``@version`` before ``.fn``): a function.
- ``sha256:<64 hex>``: a content digest.

Join set names may contain ``_`` (decision 6), so a ``<name>_<idx>`` segment is split on
its **last** underscore (spec 000 §13.2). Every parser raises ``InvalidId`` with a message
that says what is wrong.

Ids are immutable values, so the parsers of execution ids, join set ids and function names
keep the values of recently parsed texts (``_PARSED``): a write that creates a join set's
children parses the same parent, join set and function once per child, and those parses
were a tenth of its CPU.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field

from ulid import ULID

from executions.errors import InvalidId, excerpt

# Matched with ``fullmatch``: ``$`` would also match before a final newline.
_ULID_RE = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")  # 128 bits: the first character is at most 7
_JOIN_SET_NAME_RE = re.compile(r"[A-Za-z0-9_/-]+")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_FFQN_RE = re.compile(
    r"(?P<namespace>[A-Za-z0-9_-]+):(?P<package>[A-Za-z0-9_-]+)/(?P<interface>[A-Za-z0-9_/-]+)"
    r"(?:@(?P<version>[A-Za-z0-9.+-]+))?\.(?P<function>[A-Za-z_][A-Za-z0-9_-]*)"
)
JOIN_SET_KINDS = {"o": "one_off", "n": "named", "g": "generated"}

# The same formats as JSON Schema ``pattern``s (ECMA-262: ``$`` is the end of the text), for
# the OpenAPI document (D105). A child segment's index starts at 1, without leading zeros.
_SEGMENT_PATTERN = rf"\.[{''.join(JOIN_SET_KINDS)}]:{_JOIN_SET_NAME_RE.pattern}_[1-9][0-9]*"
TOP_LEVEL_ID_PATTERN = rf"^E_{_ULID_RE.pattern}$"
EXECUTION_ID_PATTERN = rf"^E_{_ULID_RE.pattern}(?:{_SEGMENT_PATTERN})*$"
DEPLOYMENT_ID_PATTERN = rf"^Dep_{_ULID_RE.pattern}$"


def _check_ulid(text: str, what: str) -> str:
    if not _ULID_RE.fullmatch(text):
        raise InvalidId(
            f"{what}: `{excerpt(text)}` is not a 26-character upper-case Crockford ULID (base32, first character 0-7)"
        )
    return text


def _prefixed_ulid(text: str, prefix: str, what: str) -> str:
    if not isinstance(text, str) or not text.startswith(prefix):
        raise InvalidId(f"{what} must look like `{prefix}<ULID>`, got `{excerpt(text)}`")
    _check_ulid(text[len(prefix) :], what)
    return text


def new_ulid() -> str:
    return str(ULID())


@dataclass(frozen=True, slots=True)
class JoinSetId:
    kind: str
    name: str

    def __post_init__(self):
        if self.kind not in JOIN_SET_KINDS:
            raise InvalidId(f"join set kind must be one of o, n, g; got `{excerpt(self.kind)}`")
        if not self.name or not _JOIN_SET_NAME_RE.fullmatch(self.name):
            raise InvalidId(
                f"join set name `{excerpt(self.name)}` must be non-empty and contain only letters, digits and `_`, `/`, `-`"
            )

    @classmethod
    def parse(cls, text: str) -> JoinSetId:
        return _parse_join_set_id(str(text))

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


_PARSED = 4096  # texts whose parsed value each parser keeps


@functools.lru_cache(maxsize=_PARSED)
def _parse_join_set_id(text: str) -> JoinSetId:
    kind, sep, name = text.partition(":")
    if not sep:
        raise InvalidId(f"join set id must look like `<kind>:<name>`, got `{excerpt(text)}`")
    return JoinSetId(kind, name)


def _parse_segment(segment: str, whole: str) -> tuple[JoinSetId, int]:
    """Parse ``<kind>:<name>_<idx>``, splitting on the last underscore."""
    head, sep, idx = segment.rpartition("_")
    if not sep or not (idx.isascii() and idx.isdigit()) or int(idx) < 1 or idx != str(int(idx)):
        raise InvalidId(f"`{excerpt(whole)}`: segment `{excerpt(segment)}` must end with `_<index>`, index from 1")
    return JoinSetId.parse(head), int(idx)


@dataclass(frozen=True, slots=True)
class ExecutionId:
    """A top-level id (empty ``path``) or a derived child id."""

    ulid: str
    path: tuple[tuple[JoinSetId, int], ...] = ()
    # Its text, made at the first ``str``: a workflow's write turns each child's id into
    # text several times (the request, the row, its events), and building it was 6 % of a
    # parent's time fanning out 200 children (py-spy, D132).
    _text: str = field(default="", init=False, repr=False, compare=False)

    @classmethod
    def generate(cls) -> ExecutionId:
        return cls(new_ulid())

    @classmethod
    def parse(cls, text: str | ExecutionId) -> ExecutionId:
        if isinstance(text, ExecutionId):
            return text
        if not isinstance(text, str) or not text.startswith("E_"):
            raise InvalidId(f"execution id must look like `E_<ULID>`, got `{excerpt(text)}`")
        return _parse_execution_id(text)

    def __str__(self) -> str:
        text = self._text
        if not text:
            text = "E_" + self.ulid + "".join(f".{js}_{idx}" for js, idx in self.path)
            object.__setattr__(self, "_text", text)  # frozen: set once, never changed
        return text

    @property
    def is_top_level(self) -> bool:
        return not self.path

    def child(self, join_set: JoinSetId, idx: int) -> ExecutionId:
        if idx < 1:
            raise InvalidId("child indexes start at 1")
        return ExecutionId(self.ulid, self.path + ((join_set, idx),))

    def split_to_parts(self) -> tuple[ExecutionId, JoinSetId]:
        """``(parent, join set)`` of a derived id."""
        if not self.path:
            raise InvalidId(f"`{self}` is a top-level execution id; it has no parent")
        return ExecutionId(self.ulid, self.path[:-1]), self.path[-1][0]

    def random_seed(self) -> int:
        """A stable 64-bit seed for a workflow's deterministic RNG (decision 4)."""
        return int.from_bytes(hashlib.sha256(str(self).encode()).digest()[:8], "big")


@functools.lru_cache(maxsize=_PARSED)
def _parse_execution_id(text: str) -> ExecutionId:
    ulid, *segments = text[2:].split(".")
    _check_ulid(ulid, "execution id")
    return ExecutionId(ulid, tuple(_parse_segment(s, text) for s in segments))


@dataclass(frozen=True, slots=True)
class DelayId:
    """A durable timer: owner execution, its join set, and the index within that set."""

    execution_id: ExecutionId
    join_set_id: JoinSetId
    idx: int

    @classmethod
    def parse(cls, text: str | DelayId) -> DelayId:
        if isinstance(text, DelayId):
            return text
        if not isinstance(text, str) or not text.startswith("Delay_"):
            raise InvalidId(f"delay id must look like `Delay_<ULID>.<kind>:<name>_<idx>`, got `{excerpt(text)}`")
        owner_text, sep, last = text[len("Delay_") :].rpartition(".")
        if not sep:
            raise InvalidId(f"delay id `{excerpt(text)}` has no `.<kind>:<name>_<idx>` part")
        owner = ExecutionId.parse("E_" + owner_text)
        join_set, idx = _parse_segment(last, text)
        return cls(owner, join_set, idx)

    def __str__(self) -> str:
        return f"Delay_{str(self.execution_id)[2:]}.{self.join_set_id}_{self.idx}"

    def split_to_parts(self) -> tuple[ExecutionId, JoinSetId]:
        return self.execution_id, self.join_set_id


@dataclass(frozen=True, slots=True)
class FunctionFqn:
    """``namespace:pkg/ifc.fn``; ``ifc`` may carry ``@version``."""

    namespace: str
    package: str
    interface: str
    function: str
    version: str | None = None

    @classmethod
    def parse(cls, text: str | FunctionFqn) -> FunctionFqn:
        if isinstance(text, FunctionFqn):
            return text
        if not isinstance(text, str):
            raise _not_a_function_name(text)
        return _parse_function_fqn(text)

    @property
    def interface_name(self) -> str:
        version = f"@{self.version}" if self.version else ""
        return f"{self.namespace}:{self.package}/{self.interface}{version}"

    def __str__(self) -> str:
        return f"{self.interface_name}.{self.function}"


@functools.lru_cache(maxsize=_PARSED)
def _parse_function_fqn(text: str) -> FunctionFqn:
    match = _FFQN_RE.fullmatch(text)
    if not match:
        raise _not_a_function_name(text)
    return FunctionFqn(**match.groupdict())


def _not_a_function_name(text) -> InvalidId:
    return InvalidId(
        f"function name must look like `namespace:pkg/ifc.fn` "
        f"(optionally `namespace:pkg/ifc@1.0.0.fn`), got `{excerpt(text)}`"
    )


def parse_run_id(text: str) -> str:
    return _prefixed_ulid(text, "Run_", "run id")


def parse_executor_id(text: str) -> str:
    return _prefixed_ulid(text, "Exr_", "executor id")


def parse_deployment_id(text: str) -> str:
    return _prefixed_ulid(text, "Dep_", "deployment id")


def new_run_id() -> str:
    return "Run_" + new_ulid()


def new_executor_id() -> str:
    return "Exr_" + new_ulid()


def new_deployment_id() -> str:
    return "Dep_" + new_ulid()


def parse_content_digest(text: str) -> str:
    if not isinstance(text, str) or not _DIGEST_RE.fullmatch(text):
        raise InvalidId(f"digest must look like `sha256:<64 lower-case hex>`, got `{excerpt(text)}`")
    return text


def content_digest(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def digest_to_bytes(digest: str) -> bytes:
    """``sha256:<hex>`` → the 32 raw bytes stored in ``component_id_input_digest``."""
    return bytes.fromhex(parse_content_digest(digest)[len("sha256:") :])


def digest_from_bytes(raw: bytes | memoryview) -> str:
    return "sha256:" + bytes(raw).hex()
