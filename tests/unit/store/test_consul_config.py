"""Consul store URLs and Consul's standard environment variables (pure parsing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.errors import EXIT_INVALID, StoreConfigError
from allocator.store import open_store
from allocator.store.consul.config import ConsulConfig, parse_consul_url


def parse(url: str, **env: str) -> ConsulConfig:
    return parse_consul_url(url, env)


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("consul://h1:8600", "http://h1:8600"),
        ("consul://h1:8600/", "http://h1:8600"),
        ("consul://h1", "http://h1:8500"),
        ("consuls://h1", "https://h1:8501"),
        ("consuls://h1:443", "https://h1:443"),
        ("consul://", "http://127.0.0.1:8500"),
        ("consul:///", "http://127.0.0.1:8500"),
        ("consul://[::1]:8500", "http://[::1]:8500"),
    ],
)
def test_urls_name_scheme_host_and_port(url: str, address: str) -> None:
    assert parse(url).address == address


def test_a_url_without_a_host_uses_consul_http_addr() -> None:
    assert parse("consul://", CONSUL_HTTP_ADDR="c1:9500").address == "http://c1:9500"
    assert parse("consul://", CONSUL_HTTP_ADDR="https://c1:9501").address == "https://c1:9501"
    assert parse("consul://", CONSUL_HTTP_ADDR="http://c1").address == "http://c1:8500"


def test_a_url_with_a_host_wins_over_consul_http_addr() -> None:
    assert parse("consul://h1:8600", CONSUL_HTTP_ADDR="c1:9500").address == "http://h1:8600"


@pytest.mark.parametrize("value", ["true", "1", "T", "TRUE"])
def test_consul_http_ssl_turns_on_https(value: str) -> None:
    assert parse("consul://h1:8501", CONSUL_HTTP_SSL=value).scheme == "https"


def test_consul_http_ssl_false_keeps_http() -> None:
    assert parse("consul://h1", CONSUL_HTTP_SSL="false").scheme == "http"


def test_an_unreadable_boolean_is_a_config_error() -> None:
    with pytest.raises(StoreConfigError, match="CONSUL_HTTP_SSL"):
        parse("consul://h1", CONSUL_HTTP_SSL="yes please")


def test_the_token_comes_from_the_environment_and_stays_out_of_repr() -> None:
    config = parse("consul://h1", CONSUL_HTTP_TOKEN="s3cret-token")

    assert config.token == "s3cret-token"
    assert "s3cret" not in repr(config) and "s3cret" not in config.address


def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")

    assert parse("consul://h1", CONSUL_HTTP_TOKEN_FILE=str(token_file)).token == "from-file"
    assert parse("consul://h1").token is None


def test_a_token_a_header_cannot_carry_is_refused_without_echoing_it() -> None:
    with pytest.raises(StoreConfigError) as caught:
        parse("consul://h1", CONSUL_HTTP_TOKEN="abc\ndef")
    assert "abc" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    ["consul://tok3n@h1:8500", "consul://user:tok3n@h1:8500", "consul://h1:8500/?token=tok3n"],
)
def test_credentials_in_the_url_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(StoreConfigError) as caught:
        parse(url)
    assert "tok3n" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "consul://h1:notaport",
        "consul://h1:99999",
        "consul://h1:8500/some/path",
        "consul://h1:8500#frag",
        "consul://:8500",
        "etcd://h1:2379",
    ],
)
def test_malformed_urls_are_config_errors(url: str) -> None:
    with pytest.raises(StoreConfigError):
        parse(url)


@pytest.mark.parametrize("addr", ["unix:///var/run/consul.sock", "h1:8500/path", "h1:port"])
def test_malformed_consul_http_addr_is_a_config_error(addr: str) -> None:
    with pytest.raises(StoreConfigError, match="CONSUL_HTTP_ADDR"):
        parse("consul://", CONSUL_HTTP_ADDR=addr)


def test_tls_material_files_are_used_when_they_exist(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    for path in (ca, cert, key):
        path.write_text("pem")

    config = parse(
        "consuls://h1",
        CONSUL_CACERT=str(ca),
        CONSUL_CLIENT_CERT=str(cert),
        CONSUL_CLIENT_KEY=str(key),
    )

    assert config.verify == str(ca)
    assert config.cert == (str(cert), str(key))


def test_a_ca_directory_is_accepted(tmp_path: Path) -> None:
    assert parse("consuls://h1", CONSUL_CAPATH=str(tmp_path)).verify == str(tmp_path)


def test_verification_can_be_turned_off() -> None:
    assert parse("consuls://h1", CONSUL_HTTP_SSL_VERIFY="false").verify is False
    assert parse("consuls://h1").verify is True


def test_a_missing_ca_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(StoreConfigError, match="CONSUL_CACERT"):
        parse("consuls://h1", CONSUL_CACERT=str(missing))


def test_a_client_cert_without_its_key_is_a_config_error(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("pem")
    with pytest.raises(StoreConfigError, match="CONSUL_CLIENT_KEY"):
        parse("consuls://h1", CONSUL_CLIENT_CERT=str(cert))


def test_open_store_reports_a_missing_ca_with_the_invalid_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSUL_CACERT", str(tmp_path / "missing.pem"))

    with pytest.raises(StoreConfigError) as caught:
        open_store("consuls://127.0.0.1:1")

    assert caught.value.exit_code == EXIT_INVALID
    assert "missing.pem" in str(caught.value)
