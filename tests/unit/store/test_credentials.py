"""Store credentials stay out of worker environments and log lines."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest

from allocator.agent.kernel.procs import clean_base_env
from allocator.agent.log import DecisionLog
from allocator.store.credentials import redact, remember_secret, strip_store_credentials

PASSWORD = "agent-store-pw-91"


def test_every_documented_store_credential_is_stripped_and_the_rest_kept() -> None:
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/home/ml",
        "HTTPS_PROXY": "http://proxy:3128",
        "CONSUL_HTTP_ADDR": "127.0.0.1:8500",
        "ALLOCATOR_STORE": f"etcd://root:{PASSWORD}@h:2379",
        "ALLOCATOR_PREFIX": "/allocator",
        "ETCDCTL_USER": "root",
        "ETCDCTL_PASSWORD": "other-pw-77",
        "ETCDCTL_CACERT": "/etc/ca.pem",
        "ETCD_PASSWORD": "x",
        "ETCD_TRUSTED_CA_FILE": "/etc/ca.pem",
        "CONSUL_HTTP_TOKEN": "tok-1234",
        "CONSUL_HTTP_TOKEN_FILE": "/etc/tok",
        "CONSUL_HTTP_AUTH": "u:p",
        "CONSUL_CLIENT_CERT": "/c.pem",
        "CONSUL_CLIENT_KEY": "/k.pem",
        "CONSUL_CACERT": "/ca.pem",
        "JOB_DB_URL": f"etcd://root:{PASSWORD}@elsewhere",  # any name holding the password
        "COPY_OF_TOKEN": "tok-1234",
    }

    kept = strip_store_credentials(environ)

    assert kept == {
        "PATH": "/usr/bin",
        "HOME": "/home/ml",
        "HTTPS_PROXY": "http://proxy:3128",
        "CONSUL_HTTP_ADDR": "127.0.0.1:8500",
    }


def test_a_secret_the_process_learned_is_stripped_whatever_the_variable() -> None:
    remember_secret("learned-from-a-token-file")
    cleaned = clean_base_env(
        {"PATH": "/bin", "X": "learned-from-a-token-file", "CUDA_VISIBLE_DEVICES": "3"}
    )
    assert cleaned == {"PATH": "/bin"}


def test_a_short_secret_only_strips_a_variable_that_is_exactly_it() -> None:
    environ = {"ETCDCTL_PASSWORD": "ab", "PATH": "/usr/bin/ab", "MINE": "ab"}
    assert strip_store_credentials(environ) == {"PATH": "/usr/bin/ab"}


def test_redact_masks_urls_and_remembered_secrets_anywhere_in_text() -> None:
    remember_secret("remembered-secret-42")
    text = f"etcd://root:{PASSWORD}@h failed; token remembered-secret-42 refused"
    assert redact(text) == "etcd://root:***@h failed; token *** refused"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_field_of_an_agent_log_line_carries_a_password(fmt: str) -> None:
    remember_secret(PASSWORD)
    stream = io.StringIO()
    log = DecisionLog(fmt, "node1", stream=stream, wall=lambda: datetime(2026, 1, 1, tzinfo=UTC))

    log("start", {"store": f"etcd://root:{PASSWORD}@h:2379"})
    log("store-unavailable", {"error": f"refused: password {PASSWORD} is wrong"})
    log("nested", {"detail": {"urls": [f"consul://h/?token={PASSWORD}"]}, "count": 3})

    text = stream.getvalue()
    assert PASSWORD not in text
    assert "root:***@h:2379" in text
    if fmt == "json":
        assert json.loads(text.splitlines()[2])["count"] == 3
