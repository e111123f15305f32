"""A value means the same to every tool: only what YAML 1.1, YAML 1.2 and JSON read alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from allocator.errors import PolicyError
from allocator.policy import load_policy
from allocator.policy.yamlspec.document import dump_yaml
from allocator.policy.yamlspec.scalars import (
    AMBIGUOUS_TAG,
    BOOL_TAG,
    FLOAT_TAG,
    INT_TAG,
    STR_TAG,
    ambiguity,
    plain_tag,
)


def only_error(text: str) -> PolicyError:
    """The single problem of ``text`` (loaded as policy.yaml)."""
    with pytest.raises(PolicyError) as info:
        load_policy(text, "policy.yaml")
    assert len(info.value.errors) == 1, [str(e) for e in info.value.errors]
    assert "\n" not in str(info.value)
    return info.value.errors[0]


def host_with(value: str) -> str:
    return f"version: 1\nhosts:\n  n1: {{gpus: {value}}}\n"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("010", "010 is ambiguous (YAML 1.1 reads it as octal 8); write 10"),
        ("09", "09 is ambiguous (YAML 1.1 reads it as text); write 9"),
        ("1_0", "1_0 is ambiguous (YAML 1.1 reads it as 10, YAML 1.2 as text); write 10"),
        ("0b11", "0b11 is ambiguous (YAML 1.1 reads it as binary 3); write 3"),
        ("0o17", "0o17 is ambiguous (YAML 1.2 reads it as octal 15, YAML 1.1 as text); write 15"),
        ("0x1F", "0x1F is hexadecimal, which JSON cannot write; write 31"),
        (
            "1:30",
            "1:30 is ambiguous (YAML 1.1 reads it as 90, base 60; YAML 1.2 as text); write 90",
        ),
        ("+4", "+4 has a leading +, which JSON does not allow; write 4"),
    ],
)
def test_integers_that_tools_read_differently_are_refused_saying_how_to_write_them(
    value: str, reason: str
) -> None:
    error = only_error(host_with(value))
    assert (error.line, error.field, error.reason) == (3, "hosts.n1.gpus", reason)


def test_octal_looking_xids_are_refused_not_read_as_11_and_25() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy("version: 1\nhealth:\n  ignored_xids: [013, 031]\n", "policy.yaml")
    reasons = [(e.field, e.reason) for e in info.value.errors]
    assert reasons == [
        ("health.ignored_xids[0]", "013 is ambiguous (YAML 1.1 reads it as octal 11); write 13"),
        ("health.ignored_xids[1]", "031 is ambiguous (YAML 1.1 reads it as octal 25); write 31"),
    ]


@pytest.mark.parametrize("word", ["on", "yes", "Yes", "off", "NO"])
def test_yaml11_booleans_are_refused_in_boolean_fields(word: str) -> None:
    error = only_error(f"version: 1\njobs:\n  a: {{command: [x], allow_adhoc_command: {word}}}\n")
    assert error.field == "jobs.a.allow_adhoc_command"
    assert error.reason.startswith(f"{word} is ambiguous (YAML 1.1 reads it as ")
    assert error.reason.endswith(f"write true or false, not {word}")


def test_yaml11_booleans_in_text_fields_must_be_quoted() -> None:
    error = only_error("version: 1\njobs:\n  a: {command: [echo, yes]}\n")
    assert error.reason == (
        "yes is ambiguous (YAML 1.1 reads it as true, YAML 1.2 as text); "
        "quote it ('yes') if you mean the text"
    )


def test_an_ambiguous_value_in_a_field_of_another_type_says_what_was_expected() -> None:
    error = only_error(host_with("yes"))
    assert error.reason == (
        "expected an integer, got yes, which is ambiguous (YAML 1.1 reads it as true, "
        "YAML 1.2 as text)"
    )


def test_true_false_plain_decimals_and_json_numbers_are_read() -> None:
    policy = load_policy(
        "version: 1\nhosts:\n  n1: {gpus: 10}\n"
        "jobs:\n  a: {command: [x], allow_adhoc_command: true, user: nobody,\n"
        "      grace_seconds: 2.5e1}\n"
        "health: {ignored_xids: [13, 0], interval_seconds: 0.5}\n"
    )
    assert policy.hosts["n1"].gpus == 10
    assert policy.jobs["a"].allow_adhoc_command is True
    assert policy.jobs["a"].grace_seconds == 25.0
    assert policy.health.ignored_xids == frozenset({0, 13})


def test_quoted_strings_stay_strings() -> None:
    policy = load_policy(
        "version: 1\njobs:\n  a: {command: ['010', \"yes\", '1:30', '0x1F', '1e3', 'on']}\n"
    )
    assert policy.jobs["a"].command == ("010", "yes", "1:30", "0x1F", "1e3", "on")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (
            '"2027-W01-1T00:00:00Z"',
            "expected an RFC 3339 time with a timezone, like 2027-01-01T00:00:00Z, "
            "got a string ('2027-W01-1T00:00:00Z')",
        ),
        (
            '"20270101T000000Z"',
            "expected an RFC 3339 time with a timezone, like 2027-01-01T00:00:00Z, "
            "got a string ('20270101T000000Z')",
        ),
        (
            "2027-01-01 10:00:00Z",
            "2027-01-01 10:00:00Z is ambiguous (YAML 1.1 reads it as a timestamp, YAML 1.2 "
            "as text); write an RFC 3339 time like 2027-01-01T00:00:00Z",
        ),
        (
            "2027-13-01T00:00:00Z",
            "'2027-13-01T00:00:00Z' is not a valid time: month must be in 1..12",
        ),
    ],
)
def test_times_are_rfc_3339_only(value: str, reason: str) -> None:
    error = only_error(
        "version: 1\nhosts: {n1: {gpus: 1}}\n"
        f"reservations:\n  - {{name: r, host: n1, gpus: [0], for: [x], until: {value}}}\n"
    )
    assert (error.field, error.reason) == ("reservations[0].until", reason)


def test_rfc_3339_times_with_offsets_and_fractions_are_read_in_utc() -> None:
    policy = load_policy(
        "version: 1\nhosts: {n1: {gpus: 1}}\nreservations:\n"
        "  - {name: r, host: n1, gpus: [0], for: [x], start: 2027-01-01T05:30:00.5+05:30,"
        " until: '2027-01-02t00:00:00z'}\n"
    )
    (reservation,) = policy.reservations
    assert reservation.start == datetime(2027, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)
    assert reservation.until == datetime(2027, 1, 2, tzinfo=timezone(timedelta(0)))


def test_a_number_too_long_to_convert_is_an_error_not_a_crash() -> None:
    error = only_error(host_with("9" * 5000))
    assert error.reason == "a 5000-digit number is out of range"


def test_dumped_yaml_quotes_every_string_the_loader_would_not_read_as_text() -> None:
    tricky = ["010", "yes", "1:30", "1e3", "0o17", ".5", "2027-01-01", "1_0", "null", "~"]
    text = dump_yaml({"version": 1, "jobs": {"a": {"command": tricky}}})
    assert load_policy(text).jobs["a"].command == tuple(tricky)


_READ_AS_OCTAL_8 = "is ambiguous (YAML 1.1 reads it as octal 8)"
_NOT_JSON = "is not a number as JSON writes it"
_AS_TIME = "is ambiguous (YAML 1.1 reads it as a timestamp, YAML 1.2 as text)"
_RFC3339_HINT = "an RFC 3339 time like 2027-01-01T00:00:00Z"


# One row (at least) per check of ``ambiguity``, each with its exact hint: a check
# left out, or one put behind another that also matches its form, changes a row
# (without the octal check, 010 would be "not a number as JSON writes it; write 10.0").
@pytest.mark.parametrize(
    ("text", "problem", "rewrite", "kind"),
    [
        ("True", "is not a boolean as JSON writes it", "true", "boolean"),
        ("FALSE", "is not a boolean as JSON writes it", "false", "boolean"),
        (
            "yes",
            "is ambiguous (YAML 1.1 reads it as true, YAML 1.2 as text)",
            "true or false, not yes",
            "boolean",
        ),
        (
            "On",
            "is ambiguous (YAML 1.1 reads it as true, YAML 1.2 as text)",
            "true or false, not On",
            "boolean",
        ),
        (
            "off",
            "is ambiguous (YAML 1.1 reads it as false, YAML 1.2 as text)",
            "true or false, not off",
            "boolean",
        ),
        ("010", _READ_AS_OCTAL_8, "10", "number"),
        ("-010", "is ambiguous (YAML 1.1 reads it as octal -8)", "-10", "number"),
        ("00", "is ambiguous (YAML 1.1 reads it as octal 0)", "0", "number"),
        ("0_10", _READ_AS_OCTAL_8, "10", "number"),
        ("01_0", _READ_AS_OCTAL_8, "10", "number"),
        ("09", "is ambiguous (YAML 1.1 reads it as text)", "9", "number"),
        ("0089", "is ambiguous (YAML 1.1 reads it as text)", "89", "number"),
        ("09_1", _NOT_JSON, "91", "number"),
        ("0x1F", "is hexadecimal, which JSON cannot write", "31", "number"),
        ("-0x1f", "is hexadecimal, which JSON cannot write", "-31", "number"),
        (
            "0o17",
            "is ambiguous (YAML 1.2 reads it as octal 15, YAML 1.1 as text)",
            "15",
            "number",
        ),
        ("0b11", "is ambiguous (YAML 1.1 reads it as binary 3)", "3", "number"),
        ("-0b1_1", "is ambiguous (YAML 1.1 reads it as binary -3)", "-3", "number"),
        (
            "1:30",
            "is ambiguous (YAML 1.1 reads it as 90, base 60; YAML 1.2 as text)",
            "90",
            "number",
        ),
        (
            "-1:30",
            "is ambiguous (YAML 1.1 reads it as -90, base 60; YAML 1.2 as text)",
            "-90",
            "number",
        ),
        (
            "1:30.5",
            "is ambiguous (YAML 1.1 reads it as 90.5, base 60; YAML 1.2 as text)",
            "90.5",
            "number",
        ),
        ("1_0", "is ambiguous (YAML 1.1 reads it as 10, YAML 1.2 as text)", "10", "number"),
        (
            "1_000.5",
            "is ambiguous (YAML 1.1 reads it as 1000.5, YAML 1.2 as text)",
            "1000.5",
            "number",
        ),
        ("+4", "has a leading +, which JSON does not allow", "4", "number"),
        ("+2.5", "has a leading +, which JSON does not allow", "2.5", "number"),
        ("1.", _NOT_JSON, "1.0", "number"),
        (".5", _NOT_JSON, "0.5", "number"),
        ("-.5", _NOT_JSON, "-0.5", "number"),
        ("01.5", _NOT_JSON, "1.5", "number"),
        ("1.e3", _NOT_JSON, "1000.0", "number"),
        ("2027-01-01 10:00:00Z", _AS_TIME, _RFC3339_HINT, "time"),
        ("2027-1-1 1:00:00", _AS_TIME, _RFC3339_HINT, "time"),
    ],
)
def test_each_ambiguous_form_is_refused_with_its_own_hint(
    text: str, problem: str, rewrite: str, kind: str
) -> None:
    assert ambiguity(text) == (problem, rewrite, kind)
    assert plain_tag(text) == AMBIGUOUS_TAG


@pytest.mark.parametrize(
    ("text", "tag"),
    [
        ("10", INT_TAG),
        ("-3", INT_TAG),
        ("0", INT_TAG),
        ("2.5", FLOAT_TAG),
        ("1e3", FLOAT_TAG),
        ("true", BOOL_TAG),
        ("x1:30", STR_TAG),
        ("v010", STR_TAG),
        ("1-2", STR_TAG),
    ],
)
def test_forms_every_tool_reads_alike_are_not_ambiguous(text: str, tag: str) -> None:
    assert plain_tag(text) == tag
