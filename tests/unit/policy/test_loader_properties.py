"""Property tests: any input gives a Policy or a PolicyError, and accepted policies round-trip."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.errors import PolicyError
from allocator.policy import Policy, load_policy, policy_json_schema, policy_to_dict
from allocator.policy.yamlspec.document import dump_yaml

VALIDATOR = jsonschema.Draft202012Validator(policy_json_schema())

_SURROGATE_PAIR = re.compile(r"\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}")


def json_text(data: Any) -> str:
    """``data`` as JSON, which is YAML, but for one thing PyYAML does not read.

    PyYAML reads no surrogate-pair escapes (``"\\ud800\\udc00"``), which
    ``json.dumps`` writes for characters past U+FFFF: those are written as
    themselves (control characters stay escaped, as YAML needs).
    """
    escaped = json.dumps(data)
    return _SURROGATE_PAIR.sub(lambda m: json.loads(f'"{m.group(0)}"'), escaped)


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

YAML_PIECES = [
    "version: 1\n",
    "hosts:\n",
    "jobs:\n",
    "pools:\n",
    "fallback:\n",
    "reservations:\n",
    "  - ",
    "  node1: ",
    "    command: ",
    "{gpus: 4}",
    "[a, b]",
    "&a ",
    "*a",
    "<<: ",
    "!!set ",
    "!!python/object:os.system ",
    "? ",
    ": ",
    "- ",
    "'",
    '"',
    "{",
    "}",
    "[",
    "]",
    ",",
    "#",
    "|\n",
    ">\n",
    "---\n",
    "...\n",
    "~",
    "\t",
    "\n",
    "  ",
    "%YAML 1.1\n",
    "2027-01-01T00:00:00Z",
    "\x00",
    "\x85",
    "\ufeff",
    "1e400",
    "0x1F",
    ".nan",
    "yes",
    "null",
    "\\",
    "@",
    "`",
]


def load_or_error(text: str) -> Policy | PolicyError:
    """Load ``text``; any exception other than PolicyError fails the test."""
    try:
        return load_policy(text, "policy.yaml")
    except PolicyError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith("policy.yaml")
        assert exc.errors and all(e.file == "policy.yaml" for e in exc.errors)
        return exc


@SETTINGS
@given(st.text(max_size=300))
def test_arbitrary_text_gives_a_policy_or_a_policy_error(text: str) -> None:
    load_or_error(text)


@SETTINGS
@given(st.lists(st.sampled_from(YAML_PIECES) | st.text(max_size=3), max_size=40).map("".join))
def test_yamlish_text_gives_a_policy_or_a_policy_error(text: str) -> None:
    load_or_error(text)


# JSON escapes characters beyond the BMP as surrogate pairs, which YAML 1.1
# (libyaml) does not read; the JSON round trips stay within the BMP.
BMP = st.characters(max_codepoint=0xFFFF, exclude_categories=["Cs"])
NAMES = st.sampled_from(["node1", "node2", "a100", "default", "cpu-8", "train", "eval-x", "w"])
ODD_NAMES = st.sampled_from(["bad/name", "", "..", "-x", "yes", "1", "a" * 64])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 9),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(BMP, max_size=4),
    NAMES,
    st.sampled_from(
        [
            "cpu",
            "wait",
            "fail",
            "restart",
            "none",
            "signal:SIGHUP",
            "per-gpu",
            "uuid",
            "index",
            "exclusive",
            "shared",
            "eval-*",
            "2027-01-01T00:00:00Z",
            "2026-01-01T00:00:00+02:00",
            "2027-01-01",
        ]
    ),
)
ANY_VALUE = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``strategy``, sometimes any value at all (to hit type errors)."""
    return st.one_of(strategy, strategy, strategy, ANY_VALUE)


def record(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A mapping with the given fields, sometimes with a stray key."""
    base = st.fixed_dictionaries(
        {key: maybe(value) for key, value in required.items()},
        optional={**{key: maybe(value) for key, value in optional.items()}, "stray": SCALARS},
    )
    return maybe(base)


GPU = st.integers(0, 9)
HOST = record({"gpus": st.integers(0, 8)}, {"pool": NAMES})
SHARING = st.sampled_from(["exclusive", "shared"]) | record(
    {"mode": st.sampled_from(["exclusive", "time-slice", "mps", "shared"])},
    {"slots": st.integers(0, 300)},
)
POOL = record(
    {},
    {
        "hosts": st.lists(NAMES, max_size=3),
        "sharing": SHARING,
        "max_gpus_per_job": st.integers(1, 4),
    },
)
TIMES = st.sampled_from(
    ["2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", "2028-06-01T12:00:00+02:00"]
)
RESERVATION = record(
    {
        "name": NAMES,
        "host": NAMES,
        "gpus": st.lists(GPU, min_size=1, max_size=3),
        "for": st.lists(NAMES, min_size=1, max_size=2),
    },
    {"start": TIMES, "until": TIMES},
)
JOB = record(
    {"command": st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=3)},
    {
        "env": st.dictionaries(
            st.sampled_from(["A", "B_1", "CUDA_VISIBLE_DEVICES", "1x"]), st.text(max_size=3)
        ),
        "cwd": st.text(min_size=1, max_size=5),
        "workers": st.sampled_from(["single", "per-gpu"]),
        "on_change": st.sampled_from(["restart", "none", "signal:SIGHUP", "signal:SIGKILL"]),
        "grace_seconds": st.floats(0, 100),
        "fallback": NAMES,
        "allow_adhoc_command": st.booleans(),
        "user": st.sampled_from(["nobody", "root", "0", "", 1000]),
        "group": st.sampled_from(["nogroup", "", 5]),
        "max_restarts": st.integers(0, 9),
        "restart_backoff_seconds": st.floats(0, 100),
        "restart_backoff_max_seconds": st.floats(0, 100),
        "exclusive": st.booleans(),
        "cpu_affinity": st.sampled_from(["local", "none", "numa"]),
    },
)
FALLBACK = record(
    {"action": st.sampled_from(["cpu", "wait", "fail"])}, {"threads": st.integers(0, 16)}
)
HEALTH = record(
    {},
    {
        "ignored_xids": st.lists(st.integers(0, 120), max_size=4),
        "interval_seconds": st.floats(0, 10),
    },
)
_DOCUMENT = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 1, 1, 1, 2])},
    optional={
        "hosts": maybe(st.dictionaries(NAMES | ODD_NAMES, HOST, max_size=3)),
        "pools": maybe(st.dictionaries(NAMES, POOL, max_size=2)),
        "reservations": maybe(st.lists(RESERVATION, max_size=3)),
        "jobs": maybe(st.dictionaries(NAMES | ODD_NAMES, JOB, max_size=3)),
        "fallback": maybe(st.dictionaries(NAMES, FALLBACK, max_size=2)),
        "visible_devices": st.sampled_from(["uuid", "index"]),
        "health": HEALTH,
    },
)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A policy-shaped document: mostly the right keys, sometimes wrong values."""
    document: dict[str, Any] = draw(_DOCUMENT)
    return document


@SETTINGS
@given(documents())
def test_policy_shaped_documents_load_consistently_with_the_schema(
    document: dict[str, Any],
) -> None:
    text = dump_yaml(document)
    result = load_or_error(text)
    input_violations = list(VALIDATOR.iter_errors(document))
    if isinstance(result, PolicyError):
        return
    # the loader accepts nothing the schema refuses ...
    assert input_violations == []
    # ... and what it accepts comes back out canonical, schema-valid and equal
    data = policy_to_dict(result)
    assert list(VALIDATOR.iter_errors(data)) == []
    assert load_policy(dump_yaml(data)) == result
    assert load_policy(json_text(data)) == result


@SETTINGS
@given(documents())
def test_schema_violations_are_loader_errors(document: dict[str, Any]) -> None:
    if next(VALIDATOR.iter_errors(document), None) is None:
        return
    result = load_or_error(dump_yaml(document))
    assert isinstance(result, PolicyError)


VALID_NAMES = st.sampled_from(
    ["node1", "n.2", "a_b", "0001", "yes", "null", "x" * 63]
) | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,12}", fullmatch=True).filter(
    lambda name: name not in (".", "..")
)
TEXT = st.text(BMP.filter(lambda c: c != "\x00"), max_size=8)
INSTANTS = ["2026-01-01T00:00:00Z", "2027-01-01T00:00:00+01:00", "2028-01-01T00:00:00Z"]


@st.composite
def valid_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A document every part of which is valid, cross references included."""
    hosts: dict[str, Any] = {
        name: {"gpus": draw(st.integers(0, 8))}
        for name in draw(st.lists(VALID_NAMES, unique=True, max_size=4))
    }
    pools: dict[str, Any] = {
        name: {} for name in draw(st.lists(VALID_NAMES, unique=True, max_size=3))
    }
    for name, host in hosts.items():
        if not pools or not draw(st.booleans()):
            continue
        pool_name = draw(st.sampled_from(sorted(pools)))
        if draw(st.booleans()):
            host["pool"] = pool_name
        else:
            pools[pool_name].setdefault("hosts", []).append(name)
    for pool_spec in pools.values():
        pool_spec.update(
            draw(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "sharing": st.sampled_from(["exclusive", "shared"])
                        | st.builds(
                            lambda mode, slots: {"mode": mode, "slots": slots},
                            st.sampled_from(["time-slice", "mps"]),
                            st.integers(1, 256),
                        ),
                        "max_gpus_per_job": st.integers(1, 8),
                    },
                )
            )
        )
    rules = {
        name: draw(
            st.sampled_from([{"action": "wait"}, {"action": "fail"}, {"action": "cpu"}])
            | st.builds(lambda n: {"action": "cpu", "threads": n}, st.integers(1, 64))
        )
        for name in draw(st.lists(VALID_NAMES, unique=True, max_size=3))
    }
    jobs = {
        name: draw(valid_jobs(sorted(rules)))
        for name in draw(st.lists(VALID_NAMES, unique=True, max_size=3))
    }
    document: dict[str, Any] = {
        "version": 1,
        "hosts": hosts,
        "pools": pools,
        "jobs": jobs,
        "fallback": rules,
    }
    document["reservations"] = draw(valid_reservations(hosts))
    if draw(st.booleans()):
        document["health"] = {
            "ignored_xids": draw(st.lists(st.integers(0, 200), unique=True, max_size=5)),
            "interval_seconds": draw(st.floats(0.5, 60)),
        }
    return document


@st.composite
def valid_jobs(draw: st.DrawFn, rules: list[str]) -> dict[str, Any]:
    """A valid job whose fallback, if any, is one of ``rules``."""
    base = draw(st.floats(0, 30))
    optional: dict[str, st.SearchStrategy[Any]] = {
        "env": st.dictionaries(
            st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True).filter(
                lambda key: (
                    not key.startswith("ALLOCATOR_")
                    and not key.startswith("CUDA_")
                    and not key.startswith("NVIDIA_")
                )
            ),
            TEXT,
            max_size=3,
        ),
        "cwd": TEXT.filter(bool),
        "workers": st.sampled_from(["single", "per-gpu"]),
        "on_change": st.sampled_from(["restart", "none", "signal:SIGHUP", "signal:SIGUSR1"]),
        "grace_seconds": st.floats(0, 120),
        "allow_adhoc_command": st.booleans(),
        "max_restarts": st.integers(0, 100),
        "restart_backoff_seconds": st.just(base),
        "restart_backoff_max_seconds": st.floats(max(base, 60.0), 600),
        "exclusive": st.booleans(),
        "cpu_affinity": st.sampled_from(["local", "none"]),
    }
    if rules:
        optional["fallback"] = st.sampled_from(rules)
    job: dict[str, Any] = draw(
        st.fixed_dictionaries(
            {"command": st.lists(TEXT.filter(bool), min_size=1, max_size=4)}, optional=optional
        )
    )
    if job.get("allow_adhoc_command"):  # whoever writes an assignment picks the command
        job["user"] = draw(st.sampled_from(["nobody", "trainer", "1000"]))
    return job


@st.composite
def valid_reservations(draw: st.DrawFn, hosts: dict[str, Any]) -> list[dict[str, Any]]:
    """Reservations of existing GPUs; a GPU reserved twice gets disjoint windows."""
    reservations: list[dict[str, Any]] = []
    for host, spec in hosts.items():
        if spec["gpus"] == 0 or not draw(st.booleans()):
            continue
        gpus = draw(st.lists(st.integers(0, spec["gpus"] - 1), unique=True, min_size=1, max_size=3))
        split = draw(st.sampled_from(INSTANTS))
        before = {"until": split, **({"start": INSTANTS[0]} if split != INSTANTS[0] else {})}
        for window in (before, {"start": split}):
            reservations.append(
                {
                    "name": f"r{len(reservations)}",
                    "host": host,
                    "gpus": gpus,
                    "for": draw(
                        st.lists(
                            st.sampled_from(["eval-*", "train", "x?[ab]"]),
                            unique=True,
                            min_size=1,
                            max_size=2,
                        )
                    ),
                    **window,
                }
            )
    return reservations


@SETTINGS
@given(valid_documents())
def test_valid_documents_load_and_round_trip(document: dict[str, Any]) -> None:
    assert list(VALIDATOR.iter_errors(document)) == []
    text = dump_yaml(document)
    result = load_or_error(text)
    assert isinstance(result, Policy), str(result)
    assert set(result.hosts) == set(document["hosts"])
    assert {name: host.gpus for name, host in result.hosts.items()} == {
        name: spec["gpus"] for name, spec in document["hosts"].items()
    }
    assert [r.name for r in result.reservations] == [r["name"] for r in document["reservations"]]
    assert {name: job.command for name, job in result.jobs.items()} == {
        name: tuple(job["command"]) for name, job in document["jobs"].items()
    }
    data = policy_to_dict(result)
    assert list(VALIDATOR.iter_errors(data)) == []
    assert load_policy(dump_yaml(data)) == result
    assert load_policy(json_text(data)) == result
    assert policy_to_dict(load_policy(json_text(data))) == data
