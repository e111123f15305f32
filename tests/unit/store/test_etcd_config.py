"""etcd URL and ETCDCTL_* parsing: pure, no server."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from allocator.errors import StoreConfigError
from allocator.store.etcd.config import (
    DEFAULT_TIMEOUT,
    EtcdConfig,
    parse_etcd_url,
    read_pem,
    redact_url,
)


def parse(url: str, **env: str) -> EtcdConfig:
    return parse_etcd_url(url, env)


# --- endpoints -------------------------------------------------------------------


def test_one_endpoint_with_port() -> None:
    config = parse("etcd://db1:2380")
    assert config.endpoints == (("db1", 2380),)
    assert config.tls is False
    assert config.username is None and config.password is None
    assert config.timeout == DEFAULT_TIMEOUT


def test_several_endpoints_default_port_and_trailing_slash() -> None:
    config = parse("etcd://h1:2379,h2,10.0.0.3:22379/")
    assert config.endpoints == (("h1", 2379), ("h2", 2379), ("10.0.0.3", 22379))
    assert config.endpoint_names == "h1:2379,h2:2379,10.0.0.3:22379"


def test_ipv6_endpoints_in_brackets() -> None:
    config = parse("etcd://[::1]:2399,[fd00::2]")
    assert config.endpoints == (("::1", 2399), ("fd00::2", 2379))
    assert config.endpoint_names == "[::1]:2399,[fd00::2]:2379"


def test_etcds_means_tls() -> None:
    assert parse("etcds://h:2379").tls is True


def test_no_endpoint_anywhere_means_local_default() -> None:
    assert parse("etcd://").endpoints == (("127.0.0.1", 2379),)


def test_etcdctl_endpoints_used_when_the_url_names_none() -> None:
    config = parse("etcd://", ETCDCTL_ENDPOINTS="http://a:1111, http://b:2222/")
    assert config.endpoints == (("a", 1111), ("b", 2222))
    assert config.tls is False


def test_https_etcdctl_endpoints_turn_tls_on() -> None:
    config = parse("etcd://", ETCDCTL_ENDPOINTS="https://a:1111")
    assert config.tls is True


def test_etcdctl_endpoints_without_scheme() -> None:
    assert parse("etcd://", ETCDCTL_ENDPOINTS="a:1,b").endpoints == (("a", 1), ("b", 2379))


def test_url_endpoints_win_over_etcdctl_endpoints() -> None:
    config = parse("etcd://mine:1234", ETCDCTL_ENDPOINTS="http://theirs:1")
    assert config.endpoints == (("mine", 1234),)


def test_mixed_schemes_in_etcdctl_endpoints_are_refused() -> None:
    with pytest.raises(StoreConfigError, match="ETCDCTL_ENDPOINTS"):
        parse("etcd://", ETCDCTL_ENDPOINTS="http://a:1,https://b:2")


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("etcd://h:notaport", "bad port"),
        ("etcd://h:0", "bad port"),
        ("etcd://h:70000", "bad port"),
        ("etcd://h:", "bad port"),
        ("etcd://:2379", "empty"),
        ("etcd://h1:2379,,h2:2379", "empty"),
        ("etcd://[::1:2379", "malformed"),
        ("etcd://::1:2379", "IPv6"),
        ("etcd://h:2379/some/path", "path"),
        ("etcd://h:2379#frag", "fragment"),
        ("etcd://h:2379?colour=blue", "unknown etcd URL option"),
        ("etcd://h:2379?timeout=soon", "timeout"),
        ("etcd://h:2379?timeout=0", "timeout"),
        ("etcd://h:2379?timeout=inf", "timeout"),
        ("http://h:2379", "not an etcd URL"),
        ("h:2379", "not an etcd URL"),
    ],
)
def test_malformed_urls_are_config_errors(url: str, complaint: str) -> None:
    with pytest.raises(StoreConfigError, match=complaint):
        parse(url)


# --- credentials -----------------------------------------------------------------


def test_credentials_in_the_url_are_percent_decoded() -> None:
    config = parse("etcd://ops:p%40ss%3Aword@h:2379")
    assert (config.username, config.password) == ("ops", "p@ss:word")


def test_url_user_takes_its_password_from_etcdctl_password() -> None:
    config = parse("etcd://ops@h:2379", ETCDCTL_PASSWORD="secret")
    assert (config.username, config.password) == ("ops", "secret")


def test_etcdctl_user_with_password() -> None:
    config = parse("etcd://h:2379", ETCDCTL_USER="ops:secret:with:colons")
    assert (config.username, config.password) == ("ops", "secret:with:colons")


def test_etcdctl_user_and_etcdctl_password() -> None:
    config = parse("etcd://h:2379", ETCDCTL_USER="ops", ETCDCTL_PASSWORD="secret")
    assert (config.username, config.password) == ("ops", "secret")


def test_url_credentials_win_over_the_environment() -> None:
    config = parse("etcd://me:mine@h:2379", ETCDCTL_USER="them:theirs")
    assert (config.username, config.password) == ("me", "mine")


def test_a_user_without_any_password_is_a_config_error() -> None:
    with pytest.raises(StoreConfigError, match="ETCDCTL_PASSWORD"):
        parse("etcd://h:2379", ETCDCTL_USER="ops")


def test_an_empty_user_name_is_a_config_error() -> None:
    with pytest.raises(StoreConfigError, match="empty"):
        parse("etcd://:pw@h:2379")


def test_the_password_is_not_in_the_config_repr() -> None:
    assert "topsecret" not in repr(parse("etcd://ops:topsecret@h:2379"))


# --- TLS files and options ---------------------------------------------------------


def test_tls_files_from_the_environment() -> None:
    config = parse(
        "etcds://h:2379", ETCDCTL_CACERT="/ca.pem", ETCDCTL_CERT="/c.pem", ETCDCTL_KEY="/k.pem"
    )
    assert (config.cacert, config.cert, config.key) == ("/ca.pem", "/c.pem", "/k.pem")


def test_tls_files_in_the_url_win_over_the_environment() -> None:
    config = parse("etcds://h:2379?cacert=/mine.pem&timeout=2.5", ETCDCTL_CACERT="/theirs.pem")
    assert config.cacert == "/mine.pem"
    assert config.timeout == 2.5


def test_a_certificate_without_its_key_is_a_config_error() -> None:
    with pytest.raises(StoreConfigError, match="key"):
        parse("etcds://h:2379", ETCDCTL_CERT="/c.pem")


def test_read_pem_names_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "ca.pem"
    with pytest.raises(StoreConfigError, match=str(missing)):
        read_pem(str(missing), "CA certificate")


def test_read_pem_refuses_a_file_that_is_not_pem(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_bytes(b"\x00\x01 not a certificate")
    with pytest.raises(StoreConfigError, match="not a PEM"):
        read_pem(str(junk), "CA certificate")


def test_read_pem_returns_the_bytes(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    assert read_pem(str(pem), "CA certificate") == pem.read_bytes()
    assert read_pem(None, "CA certificate") is None


# --- redaction ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("etcd://ops:s3cret@h:2379", "etcd://ops:***@h:2379"),
        ("etcd://ops:p@ss@h:2379", "etcd://ops:***@h:2379"),
        ("etcds://ops@h:2379", "etcds://***@h:2379"),  # a bare user part may be a token
        ("etcd://h1:2379,h2:2379", "etcd://h1:2379,h2:2379"),
    ],
)
def test_redact_url_hides_only_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_messages_about_a_bad_url_do_not_show_the_password() -> None:
    with pytest.raises(StoreConfigError) as caught:
        parse("etcd://ops:s3cret@h:badport")
    assert "s3cret" not in str(caught.value)


# --- opening without a server ----------------------------------------------------------


def test_open_with_a_missing_ca_file_is_a_config_error_and_starts_no_thread(
    tmp_path: Path,
) -> None:
    from allocator.store import open_store

    before = set(threading.enumerate())
    missing = tmp_path / "missing-ca.pem"
    with pytest.raises(StoreConfigError, match=str(missing)):
        open_store(f"etcds://127.0.0.1:2379?cacert={missing}")
    assert set(threading.enumerate()) <= before


def test_open_store_keeps_the_password_out_of_its_url() -> None:
    from allocator.store import open_store

    store = open_store("etcd://ops:s3cret@127.0.0.1:1")
    try:
        assert store.url == "etcd://ops:***@127.0.0.1:1"
    finally:
        store.close()


def test_parsing_a_url_loads_no_client() -> None:
    code = (
        "import sys; from allocator.store.etcd.config import parse_etcd_url; "
        "parse_etcd_url('etcd://h:1'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('h11', 'ssl', 'socket')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
