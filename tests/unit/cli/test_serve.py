"""``allocator serve``'s input: the listen address, an address in use, a bad store URL."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from allocator.cli.serve import parse_listen
from allocator.errors import InvalidInput


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("[::1]:9", ("::1", 9)),
        ("h.example:1", ("h.example", 1)),
    ],
)
def test_a_listen_address_is_host_and_port(text: str, address: tuple[str, int]) -> None:
    assert parse_listen(text) == address


@pytest.mark.parametrize("text", ["8080", ":8080", "h:", "h:0", "h:65536", "h:x", ""])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(InvalidInput, match="expected HOST:PORT"):
        parse_listen(text)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "allocator", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "ALLOCATOR_STORE": "memory://x"},
    )


def test_an_address_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve("--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"allocator: error: --listen 127.0.0.1:{port}: Address already in use"
    ]


def test_a_bad_store_url_is_refused_before_listening() -> None:
    result = _serve("--store", "etcd://user:hunter2@h:notaport")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "bad port" in result.stderr
    assert "hunter2" not in result.stderr
