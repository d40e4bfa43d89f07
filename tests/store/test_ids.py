"""Unit tests of ``executions.ids``: Obelisk's id formats (spec 000 §1, §13.2; decisions 6, 7)."""

from __future__ import annotations

import hashlib

import pytest

from executions.errors import InvalidId, ValidationFailed
from executions.ids import (
    DelayId,
    ExecutionId,
    FunctionFqn,
    JoinSetId,
    content_digest,
    digest_from_bytes,
    digest_to_bytes,
    new_deployment_id,
    new_executor_id,
    new_run_id,
    parse_content_digest,
    parse_deployment_id,
    parse_executor_id,
    parse_run_id,
)

pytestmark = pytest.mark.django_db  # pure functions; the marker keeps every module alike

ULID = "01JAAAAAAAAAAAAAAAAAAAAAAA"
TOP = f"E_{ULID}"


def invalid(call, *fragments: str) -> InvalidId:
    """``call`` raises ``InvalidId`` whose message names each of ``fragments``."""
    with pytest.raises(InvalidId) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return info.value


# ---------------------------------------------------------------------------------------
# Execution ids
# ---------------------------------------------------------------------------------------


def test_generated_top_level_id():
    execution_id = ExecutionId.generate()
    text = str(execution_id)
    assert text.startswith("E_") and len(text) == 28
    assert execution_id.is_top_level
    assert ExecutionId.parse(text) == execution_id
    assert ExecutionId.generate() != execution_id


def test_top_level_id_roundtrip_and_has_no_parent():
    execution_id = ExecutionId.parse(TOP)
    assert (execution_id.ulid, execution_id.path, str(execution_id)) == (ULID, (), TOP)
    assert execution_id.is_top_level
    assert ExecutionId.parse(execution_id) is execution_id
    invalid(execution_id.split_to_parts, TOP, "top-level")


@pytest.mark.parametrize(
    ("join_set", "idx", "text"),
    [
        (JoinSetId("o", "a"), 1, f"{TOP}.o:a_1"),
        (JoinSetId("n", "my_join_set"), 12, f"{TOP}.n:my_join_set_12"),
        (JoinSetId("g", "x/y-z_"), 3, f"{TOP}.g:x/y-z__3"),
        (JoinSetId("n", "1_2_3"), 4, f"{TOP}.n:1_2_3_4"),
    ],
    ids=["simple", "underscores", "trailing-underscore", "digit-name"],
)
def test_derived_id_splits_on_the_last_underscore(join_set, idx, text):
    parent = ExecutionId.parse(TOP)
    child = parent.child(join_set, idx)
    assert str(child) == text
    parsed = ExecutionId.parse(text)
    assert parsed == child and not parsed.is_top_level
    assert parsed.path == ((join_set, idx),)
    assert parsed.split_to_parts() == (parent, join_set)


def test_nested_derived_ids():
    top = ExecutionId.parse(TOP)
    level1 = top.child(JoinSetId("o", "first_js"), 1)
    level2 = level1.child(JoinSetId("g", "second_js"), 2)
    level3 = level2.child(JoinSetId("n", "third"), 10)
    text = f"{TOP}.o:first_js_1.g:second_js_2.n:third_10"
    assert str(level3) == text
    assert ExecutionId.parse(text) == level3
    assert level3.split_to_parts() == (level2, JoinSetId("n", "third"))
    assert level2.split_to_parts() == (level1, JoinSetId("g", "second_js"))
    assert level1.split_to_parts() == (top, JoinSetId("o", "first_js"))
    assert ExecutionId.parse(str(level2)).split_to_parts()[0] == level1


def test_child_index_starts_at_one():
    invalid(lambda: ExecutionId.parse(TOP).child(JoinSetId("n", "js"), 0), "start at 1")


def test_random_seed_is_stable_per_id():
    child = ExecutionId.parse(f"{TOP}.n:js_1")
    assert child.random_seed() == ExecutionId.parse(f"{TOP}.n:js_1").random_seed()
    assert child.random_seed() != ExecutionId.parse(TOP).random_seed()
    assert 0 <= child.random_seed() < 2**64


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (f"E_{ULID.lower()}", ("upper-case Crockford ULID", ULID.lower())),
        (ULID, ("E_<ULID>", ULID)),
        (f"X_{ULID}", ("E_<ULID>",)),
        ("E_", ("ULID",)),
        (f"E_{ULID}A", ("26-character",)),
        (f"E_{ULID[:-1]}I", ("Crockford",)),  # I, L, O, U are not Crockford digits
        pytest.param("E_8ZZZZZZZZZZZZZZZZZZZZZZZZZ", ("ULID",)),
        (f"{TOP}.x:js_1", ("kind", "o, n, g", "`x`")),
        (f"{TOP}.js_1", ("<kind>:<name>", "js")),
        (f"{TOP}.n:_1", ("join set name", "non-empty")),
        (f"{TOP}.n:a.b_1", ("segment",)),
        (f"{TOP}.n:a b_1", ("join set name `a b`",)),
        (f"{TOP}.n:js_0", ("index from 1", "n:js_0")),
        (f"{TOP}.n:js_x", ("_<index>", "n:js_x")),
        (f"{TOP}.n:js_01", ("index from 1", "n:js_01")),
        (f"{TOP}.n:js_", ("_<index>",)),
        (f"{TOP}.n:js", ("_<index>", "n:js")),
        (f"{TOP}.n:js_-1", ("_<index>",)),
        (f"{TOP}.", ("segment",)),
        (f"{TOP}..n:js_1", ("segment",)),
        pytest.param(f"{TOP}.n:js_²", ("_<index>",)),
        ("", ("E_<ULID>",)),
        (None, ("E_<ULID>",)),
    ],
    ids=[
        "lowercase-ulid",
        "missing-prefix",
        "wrong-prefix",
        "empty-ulid",
        "ulid-too-long",
        "non-crockford-char",
        "ulid-overflow",
        "bad-kind",
        "no-kind",
        "empty-name",
        "dot-in-name",
        "space-in-name",
        "index-0",
        "non-numeric-index",
        "leading-zero-index",
        "empty-index",
        "no-index",
        "negative-index",
        "trailing-dot",
        "empty-segment",
        "superscript-digit-index",
        "empty",
        "none",
    ],  # fmt: skip
)
def test_invalid_execution_ids(text, fragments):
    error = invalid(lambda: ExecutionId.parse(text), *fragments)
    assert isinstance(error, ValidationFailed)  # the API maps it to 400


# ---------------------------------------------------------------------------------------
# Join set ids
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["o:a", "n:my_js", "g:a/b-c_d", "n:0"])
def test_join_set_id_roundtrip(text):
    join_set = JoinSetId.parse(text)
    assert str(join_set) == text
    assert (join_set.kind, join_set.name) == tuple(text.split(":", 1))


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("js", ("<kind>:<name>", "`js`")),
        ("x:js", ("o, n, g", "`x`")),
        (":js", ("kind",)),
        ("n:", ("non-empty",)),
        ("n:a:b", ("`a:b`",)),
        ("n:a.b", ("`a.b`",)),
        ("n:ä", ("letters, digits",)),
    ],
    ids=["no-colon", "bad-kind", "empty-kind", "empty-name", "colon-in-name", "dot-in-name", "non-ascii"],
)
def test_invalid_join_set_ids(text, fragments):
    invalid(lambda: JoinSetId.parse(text), *fragments)


# ---------------------------------------------------------------------------------------
# Delay ids
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "join_set", "idx"),
    [
        (TOP, JoinSetId("n", "timer"), 1),
        (TOP, JoinSetId("o", "sleep_5_s"), 7),
        (f"{TOP}.o:child_js_1.g:x_2", JoinSetId("n", "t_1"), 3),
    ],
    ids=["top-level-owner", "underscores", "derived-owner"],
)
def test_delay_id_roundtrip_and_split_to_parts(owner, join_set, idx):
    owner_id = ExecutionId.parse(owner)
    delay = DelayId(owner_id, join_set, idx)
    text = f"Delay_{owner[2:]}.{join_set}_{idx}"
    assert str(delay) == text
    parsed = DelayId.parse(text)
    assert parsed == delay
    assert parsed.split_to_parts() == (owner_id, join_set)
    assert parsed.idx == idx
    assert DelayId.parse(parsed) is parsed


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (f"E_{ULID}.n:t_1", ("Delay_",)),
        (f"delay_{ULID}.n:t_1", ("Delay_",)),
        (f"Delay_{ULID}", ("has no", "_<idx>")),
        (f"Delay_{ULID.lower()}.n:t_1", ("ULID",)),
        (f"Delay_{ULID}.n:t_0", ("index from 1",)),
        (f"Delay_{ULID}.n:t_01", ("index from 1",)),
        (f"Delay_{ULID}.n:t_x", ("_<index>",)),
        (f"Delay_{ULID}.q:t_1", ("o, n, g",)),
        (f"Delay_{ULID}.n:_1", ("non-empty",)),
        (None, ("Delay_",)),
    ],
    ids=[
        "execution-prefix",
        "lowercase-prefix",
        "no-join-set",
        "lowercase-ulid",
        "index-0",
        "leading-zero",
        "non-numeric-index",
        "bad-kind",
        "empty-name",
        "none",
    ],  # fmt: skip
)
def test_invalid_delay_ids(text, fragments):
    invalid(lambda: DelayId.parse(text), *fragments)


# ---------------------------------------------------------------------------------------
# Function names
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parts", "interface_name"),
    [
        ("ns:pkg/ifc.fn", ("ns", "pkg", "ifc", "fn", None), "ns:pkg/ifc"),
        (
            "test:pkg/workflow.run-cancellable",
            ("test", "pkg", "workflow", "run-cancellable", None),
            "test:pkg/workflow",
        ),
        ("ns:pkg/ifc@1.2.3.fn", ("ns", "pkg", "ifc", "fn", "1.2.3"), "ns:pkg/ifc@1.2.3"),
        ("ns:pkg/ifc@1.0.0-rc.1.do_it", ("ns", "pkg", "ifc", "do_it", "1.0.0-rc.1"), "ns:pkg/ifc@1.0.0-rc.1"),
        ("my-ns:my_pkg/a/b.f", ("my-ns", "my_pkg", "a/b", "f", None), "my-ns:my_pkg/a/b"),
    ],
    ids=["plain", "cancellable", "version", "prerelease-version", "nested-interface"],
)
def test_function_fqn(text, parts, interface_name):
    ffqn = FunctionFqn.parse(text)
    assert (ffqn.namespace, ffqn.package, ffqn.interface, ffqn.function, ffqn.version) == parts
    assert ffqn.interface_name == interface_name
    assert str(ffqn) == text
    assert FunctionFqn.parse(ffqn) is ffqn


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fn",
        "ns:pkg.fn",
        "ns:pkg/ifc",
        "pkg/ifc.fn",
        "ns:pkg/ifc.",
        "ns:pkg/ifc.1fn",
        "ns:pkg/ifc@.fn",
        "ns pkg/ifc.fn",
        None,
    ],
    ids=[
        "empty",
        "bare",
        "no-interface",
        "no-function",
        "no-namespace",
        "empty-function",
        "digit-function",
        "empty-version",
        "space",
        "none",
    ],  # fmt: skip
)
def test_invalid_function_fqn(text):
    invalid(lambda: FunctionFqn.parse(text), "namespace:pkg/ifc.fn", f"`{text}`")


# ---------------------------------------------------------------------------------------
# Prefixed ids and digests
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parse", "new", "prefix"),
    [
        (parse_run_id, new_run_id, "Run_"),
        (parse_executor_id, new_executor_id, "Exr_"),
        (parse_deployment_id, new_deployment_id, "Dep_"),
    ],
    ids=["run", "executor", "deployment"],
)
def test_prefixed_ids(parse, new, prefix):
    generated = new()
    assert generated.startswith(prefix) and len(generated) == len(prefix) + 26 <= 30  # fits the columns (§1)
    assert parse(generated) == generated
    invalid(lambda: parse(f"Xyz_{ULID}"), f"`{prefix}<ULID>`")
    invalid(lambda: parse(f"{prefix}{ULID.lower()}"), "ULID")
    invalid(lambda: parse(f"{prefix}"), "ULID")


def test_content_digest():
    assert content_digest(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    digest = content_digest(b"hello")
    assert digest == "sha256:" + hashlib.sha256(b"hello").hexdigest()
    assert len(digest) == 71  # ContentDigest is TEXT(71) (§1)
    assert parse_content_digest(digest) == digest
    raw = digest_to_bytes(digest)
    assert raw == hashlib.sha256(b"hello").digest() and len(raw) == 32
    assert digest_from_bytes(raw) == digest
    assert digest_from_bytes(memoryview(raw)) == digest


@pytest.mark.parametrize(
    "text",
    [
        "sha256:" + "A" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 65,
        "md5:" + "0" * 64,
        "0" * 64,
        "sha256:" + "g" * 64,
        None,
    ],
    ids=["uppercase-hex", "too-short", "too-long", "wrong-algorithm", "no-prefix", "not-hex", "none"],
)
def test_invalid_digests(text):
    invalid(lambda: parse_content_digest(text), "sha256:<64 lower-case hex>")
    invalid(lambda: digest_to_bytes(text), "sha256:")


@pytest.mark.parametrize(
    ("parse", "valid"),
    [
        (ExecutionId.parse, TOP),
        (ExecutionId.parse, f"{TOP}.n:batch_1"),
        (DelayId.parse, f"Delay_{ULID}.o:1_1"),
        (JoinSetId.parse, "n:batch"),
        (FunctionFqn.parse, "ns:pkg/ifc.fn"),
        (parse_run_id, f"Run_{ULID}"),
        (parse_executor_id, f"Exr_{ULID}"),
        (parse_deployment_id, f"Dep_{ULID}"),
        (parse_content_digest, "sha256:" + "0" * 64),
    ],
    ids=["top-level", "derived", "delay", "join-set", "function", "run", "executor", "deployment", "digest"],
)
@pytest.mark.parametrize("tail", ["\n", "\r\n", " ", "\x00"], ids=["newline", "crlf", "space", "nul"])
def test_an_id_with_anything_after_it_is_refused_not_kept_with_the_tail(parse, valid, tail):
    """Every id is matched whole: a pattern anchored with ``$`` also matches before a final
    newline, which let ``E_<ULID>\\n`` through as a different execution id than ``E_<ULID>``."""
    parse(valid)
    invalid(lambda: parse(valid + tail))
