"""Store URLs: schemes, SQLite options, malformed input and redaction, without any server."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.errors import StoreConfigError
from allocator.store import open_store, store_username
from allocator.store.etcd.config import parse_etcd_url
from allocator.store.urls import (
    SqliteUrl,
    parse_sqlite_url,
    redact_url,
    redact_urls,
    scheme_of,
    url_secrets,
)

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"etcd://ops:{SECRET}@h:2379", "etcd://ops:***@h:2379"),
        (
            f"etcds://ops:{SECRET}@h1:2379,h2:2379/?timeout=3",
            "etcds://ops:***@h1:2379,h2:2379/?timeout=3",
        ),
        (f"consul://h:8500/?token={SECRET}&x=1", "consul://h:8500/?token=***&x=1"),
        (f"etcd://h/?password={SECRET}", "etcd://h/?password=***"),
        (f"etcd://ops:{SECRET}/with?slash@h", "etcd://ops:***@h"),  # raw / and ? in it
        ("etcd://h:2379", "etcd://h:2379"),
        ("etcd://tok3n@h:2379", "etcd://***@h:2379"),
        ("etcd://t0k@h:1?q=a@b", "etcd://***@b"),
        ("sqlite:///var/lib/a.db?mode=ro", "sqlite:///var/lib/a.db?mode=ro"),
    ],
)
def test_redaction_masks_passwords_and_secret_parameters_only(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_every_url_in_free_text_is_redacted() -> None:
    text = f"failed: etcd://a:{SECRET}@h1 and consul://h/?token={SECRET} (retry)"

    redacted = redact_urls(text)

    assert SECRET not in redacted
    assert redacted.startswith("failed: etcd://a:***@h1 and consul://h/?token=*** (retry)")


def test_url_secrets_lists_the_password_as_typed_and_decoded() -> None:
    assert set(url_secrets("etcd://u:p%40ss@h/?token=t0k")) == {"p%40ss", "p@ss", "t0k"}
    assert url_secrets("etcd://u@h") == ()


@pytest.mark.parametrize("url", ["", "nosuch://x", "etcd:/h", "ETCD://h", "x" * 5000])
def test_unknown_or_malformed_schemes_are_config_errors(url: str) -> None:
    with pytest.raises(StoreConfigError):
        scheme_of(url)


def test_the_unknown_scheme_error_does_not_echo_the_password() -> None:
    with pytest.raises(StoreConfigError) as caught:
        open_store(f"etc://root:{SECRET}@h:2379")

    assert SECRET not in str(caught.value) and "scheme 'etc'" in str(caught.value)


# --- malformed URLs are input errors (exit 2), never a crash ------------------------


@pytest.mark.parametrize(
    "url",
    [
        "etcd://[::1",
        "etcd://h:2379?timeout=1e308",
        "etcd://h:2379?timeout=nan",
        "etcd://h:2379?timeout=0",
        "consul://[::1",
        "consul://h:99999",
        "sqlite:///x.db?nosuch=1",
        "sqlite:///x.db?mode=rwx",
        "sqlite:///x.db#frag",
        "sqlite:///a\x00b.db",
        "sqlite://user:pw@/x.db",
        "sqlite://~no-such-user-here/x.db",
    ],
)
def test_malformed_urls_are_refused_before_any_io(url: str, tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError) as caught:
        open_store(url)
    assert caught.value.exit_code == 2


def test_sqlite_urls_take_a_mode_and_escaped_special_characters() -> None:
    assert parse_sqlite_url("sqlite:///x.db?mode=ro") == SqliteUrl(Path("/x.db"), "ro")
    assert parse_sqlite_url("sqlite:///a%3Fb%23c.db") == SqliteUrl(Path("/a?b#c.db"), None)


def test_a_sqlite_mode_ro_url_opens_the_file_not_a_file_named_after_the_query(
    tmp_path: Path,
) -> None:
    db = tmp_path / "x.db"
    open_store(f"sqlite://{db}").put("/k", b"v")

    store = open_store(f"sqlite://{db}?mode=ro")
    try:
        got = store.get("/k")
    finally:
        store.close()

    assert got is not None and got.value == b"v"
    assert sorted(p.name for p in tmp_path.iterdir() if "?" in p.name) == []


def test_a_sqlite_url_with_a_slash_too_many_names_the_same_file_for_writes_and_reads(
    tmp_path: Path,
) -> None:
    # sqlite:////abs used to be written through and then refused by every read.
    extra = f"sqlite:///{tmp_path}/x.db"
    assert parse_sqlite_url(extra).path == tmp_path / "x.db"
    writer = open_store(extra, create=True)
    try:
        writer.put("/k", b"v")
    finally:
        writer.close()
    reader = open_store(extra + "?mode=ro")
    try:
        got = reader.get("/k")
    finally:
        reader.close()
    assert got is not None and got.value == b"v"


# --- TLS is never silently dropped ------------------------------------------------


@pytest.mark.parametrize(
    ("url", "env"),
    [
        ("etcd://h:2379?cacert=/ca.pem", {}),
        ("etcd://h:2379?cert=/c.pem&key=/k.pem", {}),
        ("etcd://u:pw@h:2379", {"ETCDCTL_CACERT": "/ca.pem"}),
    ],
)
def test_tls_files_on_a_plaintext_etcd_url_are_refused(url: str, env: dict[str, str]) -> None:
    with pytest.raises(StoreConfigError, match=r"plaintext.*etcds://"):
        parse_etcd_url(url, env)


def test_tls_files_with_etcds_or_https_endpoints_are_accepted() -> None:
    assert parse_etcd_url("etcds://h:2379?cacert=/ca.pem", {}).tls
    https = {"ETCDCTL_ENDPOINTS": "https://h:2379", "ETCDCTL_CACERT": "/ca.pem"}
    assert parse_etcd_url("etcd://", https).tls


def test_tls_files_for_a_plaintext_consul_connection_are_refused(tmp_path: Path) -> None:
    from allocator.store.consul.config import parse_consul_url

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(StoreConfigError, match="plaintext"):
        parse_consul_url("consul://h:8500", {"CONSUL_CACERT": str(ca)})
    assert parse_consul_url("consuls://h:8501", {"CONSUL_CACERT": str(ca)}).scheme == "https"


@pytest.mark.parametrize(
    ("url", "env", "user"),
    [
        ("etcd://ops:pw@127.0.0.1:2379", {}, "ops"),
        ("etcds://127.0.0.1:2379", {"ETCDCTL_USER": "ci:pw"}, "ci"),
        ("etcd://127.0.0.1:2379", {}, None),
        ("etcd://[bad", {}, None),  # malformed: names no one
        ("consul://127.0.0.1:8500?token=t", {"ETCDCTL_USER": "ci:pw"}, None),
        ("sqlite:///var/lib/a.db", {"ETCDCTL_USER": "ci:pw"}, None),
    ],
)
def test_store_username_is_the_etcd_user_the_url_or_environment_names(
    url: str, env: dict[str, str], user: str | None
) -> None:
    assert store_username(url, env) == user
