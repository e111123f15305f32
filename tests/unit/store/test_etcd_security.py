"""etcd authentication and TLS, against real etcd servers set up for them."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from allocator.errors import PermissionDenied, StoreConfigError, StoreUnavailable
from allocator.store import Compare, Event, Put, Store, Watch, open_store
from tests.support.etcd_server import EtcdServer, TlsFiles

OPS_PASSWORD = "ops-pw-42"
ALLOWED = "/allocator/"
DEADLINE_S = 20.0
UNAVAILABLE_BOUND_S = 10.0


#: Opens an etcd store (``connect(url)``).
Connect = Callable[[str], Store]


@pytest.fixture
def connect() -> Connect:
    """How every caller opens an etcd store."""
    return open_store


def collect(watch: Watch, count: int) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(events) < count and time.monotonic() < deadline:
        events.extend(watch.next(0.5))
    return events


@pytest.fixture(autouse=True)
def _no_etcdctl_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set exactly the ETCDCTL_* variables they mean."""
    for name in ("ENDPOINTS", "USER", "PASSWORD", "CACERT", "CERT", "KEY"):
        monkeypatch.delenv(f"ETCDCTL_{name}", raising=False)


# --- authentication ------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """etcd with auth on, and user ``ops`` allowed read/write under /allocator/ only."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd-auth"), auth=True)
    server.start()
    try:
        server.etcdctl("role", "add", "allocator")
        server.etcdctl(
            "role", "grant-permission", "allocator", "--prefix=true", "readwrite", ALLOWED
        )
        server.etcdctl("user", "add", f"ops:{OPS_PASSWORD}")
        server.etcdctl("user", "grant-role", "ops", "allocator")
        yield server
    finally:
        server.stop()


def ops_url(server: EtcdServer, password: str = OPS_PASSWORD) -> str:
    return f"etcd://ops:{password}@{server.endpoint}"


@pytest.fixture
def ops_store(auth_server: EtcdServer, connect: Connect) -> Iterator[Store]:
    store = connect(ops_url(auth_server))
    yield store
    store.close()


def test_the_right_user_inside_its_prefix_can_do_everything(ops_store: Store) -> None:
    key = f"{ALLOWED}auth/k"
    written = ops_store.put(key, b"v1")
    watch = ops_store.watch(f"{ALLOWED}auth/", written)
    try:
        updated = ops_store.txn([Compare(key, written)], [Put(key, b"v2")])
        lease = ops_store.grant_lease(30)
        ops_store.put(f"{ALLOWED}auth/leased", b"x", lease=lease)
        ops_store.refresh_lease(lease)
        ops_store.revoke_lease(lease)
        assert [e.revision for e in collect(watch, 2)][:2] == [written, updated]
    finally:
        watch.close()
    assert [kv.key for kv in ops_store.list(f"{ALLOWED}auth/").items] == [key]


def test_credentials_from_etcdctl_variables(
    auth_server: EtcdServer, monkeypatch: pytest.MonkeyPatch, connect: Connect
) -> None:
    monkeypatch.setenv("ETCDCTL_USER", "ops")
    monkeypatch.setenv("ETCDCTL_PASSWORD", OPS_PASSWORD)
    store = connect(auth_server.url)
    try:
        assert store.put(f"{ALLOWED}env/k", b"v") > 0
    finally:
        store.close()


@pytest.mark.parametrize(
    "url_of",
    [
        lambda s: ops_url(s, "wrong-password"),
        lambda s: f"etcd://nobody:whatever@{s.endpoint}",
    ],
    ids=["wrong-password", "unknown-user"],
)
def test_refused_credentials_are_permission_denied(
    auth_server: EtcdServer, url_of: object, connect: Connect
) -> None:
    store = connect(url_of(auth_server))  # type: ignore[operator]
    try:
        with pytest.raises(PermissionDenied) as caught:
            store.get(f"{ALLOWED}k")
        assert "authentication failed" in str(caught.value)
        assert "wrong-password" not in str(caught.value)
        assert "whatever" not in str(caught.value)
    finally:
        store.close()


def test_no_credentials_is_permission_denied_saying_how_to_give_them(
    auth_server: EtcdServer, connect: Connect
) -> None:
    store = connect(auth_server.url)
    try:
        with pytest.raises(PermissionDenied, match="ETCDCTL_USER"):
            store.list(ALLOWED)
    finally:
        store.close()


def test_outside_its_prefix_the_user_is_denied(ops_store: Store) -> None:
    with pytest.raises(PermissionDenied):
        ops_store.put("/elsewhere/k", b"v")
    with pytest.raises(PermissionDenied):
        ops_store.get("/elsewhere/k")
    with pytest.raises(PermissionDenied):
        ops_store.list("/elsewhere/")
    with pytest.raises(PermissionDenied):
        ops_store.txn([], [Put(f"{ALLOWED}ok", b"v"), Put("/elsewhere/k", b"v")])
    assert ops_store.get(f"{ALLOWED}ok") is None


def test_a_watch_outside_its_prefix_is_denied_not_silently_dead(ops_store: Store) -> None:
    refused = r"refused watch /elsewhere/ \(prefix\) \(user ops\)"
    with pytest.raises(PermissionDenied, match=refused):
        ops_store.watch("/elsewhere/", 1)


def test_the_store_logs_in_again_when_its_simple_token_is_forgotten(
    auth_server: EtcdServer, ops_store: Store
) -> None:
    ops_store.put(f"{ALLOWED}token/k", b"1")
    # Turning auth off and on forgets every simple token ("invalid auth token").
    auth_server.etcdctl("auth", "disable")
    auth_server.etcdctl("auth", "enable")
    got = ops_store.get(f"{ALLOWED}token/k")
    assert got is not None and got.value == b"1"
    auth_server.etcdctl("auth", "disable")
    auth_server.etcdctl("auth", "enable")
    watch = ops_store.watch(f"{ALLOWED}token/", got.mod_revision)
    try:
        assert [e.value for e in collect(watch, 1)] == [b"1"]
    finally:
        watch.close()


def test_the_store_logs_in_again_when_its_jwt_is_from_an_older_auth_revision(
    tmp_path: Path, connect: Connect
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed; cannot make a JWT signing key")
    _openssl("genrsa -out jwt.key 2048", cwd=tmp_path)
    _openssl("rsa -in jwt.key -pubout -out jwt.pub", cwd=tmp_path)
    jwt = f"--auth-token=jwt,pub-key={tmp_path / 'jwt.pub'},priv-key={tmp_path / 'jwt.key'}"
    server = EtcdServer(tmp_path / "etcd", auth=True, extra_args=[f"{jwt},sign-method=RS256"])
    server.start()
    try:
        server.etcdctl("user", "add", f"ops:{OPS_PASSWORD}")
        server.etcdctl("role", "add", "allocator")
        server.etcdctl(
            "role", "grant-permission", "allocator", "--prefix=true", "readwrite", ALLOWED
        )
        server.etcdctl("user", "grant-role", "ops", "allocator")
        store = connect(ops_url(server))
        try:
            store.put(f"{ALLOWED}jwt/k", b"1")
            # Any change to users or roles makes earlier JWTs "old".
            server.etcdctl("role", "add", "unrelated")
            assert store.put(f"{ALLOWED}jwt/k", b"2") > 0
        finally:
            store.close()
    finally:
        server.stop()


def test_credentials_for_a_server_without_auth_are_a_config_error(
    etcd_server: EtcdServer, connect: Connect
) -> None:
    store = connect(f"etcd://ops:pw@{etcd_server.endpoint}")
    try:
        with pytest.raises(StoreConfigError, match="authentication is not enabled"):
            store.get("/k")
    finally:
        store.close()


# --- TLS ---------------------------------------------------------------------------------


def _openssl(command: str, cwd: Path) -> None:
    """Run ``openssl`` with ``command`` split on spaces (no argument has one)."""
    subprocess.run(
        ["openssl", *command.split()], cwd=cwd, check=True, capture_output=True, timeout=60
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throwaway CA and a loopback certificate it signed (server and client use)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed; cannot make test certificates")
    where = tmp_path_factory.mktemp("tls")
    _openssl(
        "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2"
        " -subj /CN=allocator-test-ca",
        cwd=where,
    )
    _openssl(
        "req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj /CN=127.0.0.1",
        cwd=where,
    )
    (where / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl(
        "x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem"
        " -days 2 -extfile ext.cnf",
        cwd=where,
    )
    return TlsFiles(ca=where / "ca.pem", cert=where / "node.pem", key=where / "node.key")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, certs: TlsFiles) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd-tls"), tls=certs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_etcds_with_the_ca_from_etcdctl_cacert_works(
    tls_server: EtcdServer, certs: TlsFiles, monkeypatch: pytest.MonkeyPatch, connect: Connect
) -> None:
    assert tls_server.url.startswith("etcds://")
    monkeypatch.setenv("ETCDCTL_CACERT", str(certs.ca))
    store = connect(tls_server.url)
    try:
        written = store.put("/tls/k", b"secret")
        watch = store.watch("/tls/", written)
        try:
            assert [e.value for e in collect(watch, 1)] == [b"secret"]
        finally:
            watch.close()
    finally:
        store.close()


def test_etcdctl_endpoints_with_https_and_the_ca_in_the_url(
    tls_server: EtcdServer, certs: TlsFiles, monkeypatch: pytest.MonkeyPatch, connect: Connect
) -> None:
    monkeypatch.setenv("ETCDCTL_ENDPOINTS", f"https://{tls_server.endpoint}")
    store = connect(f"etcd://?cacert={certs.ca}")
    try:
        assert store.put("/tls/env", b"v") > 0
    finally:
        store.close()


def test_a_server_certificate_from_an_unknown_ca_is_refused(
    tls_server: EtcdServer, connect: Connect
) -> None:
    store = connect(tls_server.url)  # no CA given: the system roots do not know ours
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            store.get("/tls/k")
        assert time.monotonic() - started < UNAVAILABLE_BOUND_S
    finally:
        store.close()


def test_plain_etcd_url_to_a_tls_port_is_unavailable(
    tls_server: EtcdServer, connect: Connect
) -> None:
    store = connect(f"etcd://{tls_server.endpoint}")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=tls_server.endpoint):
            store.get("/tls/k")
        assert time.monotonic() - started < UNAVAILABLE_BOUND_S
    finally:
        store.close()


def test_a_missing_ca_file_is_a_config_error_naming_it(
    tls_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, connect: Connect
) -> None:
    missing = tmp_path / "no-such-ca.pem"
    monkeypatch.setenv("ETCDCTL_CACERT", str(missing))
    with pytest.raises(StoreConfigError, match=str(missing)):
        connect(tls_server.url)


def test_client_certificates_from_etcdctl_cert_and_key(
    tmp_path: Path, certs: TlsFiles, monkeypatch: pytest.MonkeyPatch, connect: Connect
) -> None:
    mutual = TlsFiles(certs.ca, certs.cert, certs.key, client_auth=True)
    server = EtcdServer(tmp_path / "etcd-mtls", tls=mutual)
    server.start()
    try:
        monkeypatch.setenv("ETCDCTL_CACERT", str(certs.ca))
        anonymous = connect(server.url)
        try:
            with pytest.raises(StoreUnavailable):
                anonymous.get("/mtls/k")
        finally:
            anonymous.close()
        monkeypatch.setenv("ETCDCTL_CERT", str(certs.cert))
        monkeypatch.setenv("ETCDCTL_KEY", str(certs.key))
        store = connect(server.url)
        try:
            assert store.put("/mtls/k", b"v") > 0
        finally:
            store.close()
    finally:
        server.stop()
