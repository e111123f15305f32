"""The wire between the door and the server: requests round-trip, garbage is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from allocator.resident import wire


def test_a_request_carries_words_environment_directory_umask_limits_and_ignored_signals() -> None:
    import resource
    import signal

    encoded = wire.encode_request(["set", "job=a", "caf\udce9"], [signal.SIGHUP])
    assert int.from_bytes(encoded[:4], "big") == len(encoded) - 4
    protocol, argv, environ, cwd, mask, limits, ignored = wire.decode_request(encoded[4:])
    assert protocol == wire.PROTOCOL
    assert argv == [b"set", b"job=a", b"caf\xe9"]  # undecodable bytes survive
    assert environ == dict(os.environb)
    assert cwd == os.getcwdb()
    assert 0 <= mask <= 0o777
    # Every limit a command's processes inherit: locked memory (NCCL, RDMA) and stack too.
    carried = {which: (soft, hard) for which, soft, hard in limits}
    for name in ("RLIMIT_MEMLOCK", "RLIMIT_STACK", "RLIMIT_NOFILE", "RLIMIT_NPROC"):
        which = getattr(resource, name)
        assert carried[which] == resource.getrlimit(which), name
    assert ignored == [signal.SIGHUP]


def test_the_ignorable_signals_are_those_a_terminal_and_nohup_send() -> None:
    import signal

    names = {signal.Signals(number).name for number in wire.INHERITED_IGNORED}
    assert names == {"SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGTSTP", "SIGTTIN", "SIGTTOU"}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x01",
        b"not marshal",
        __import__("marshal").dumps((99, [], {}, b"/", 0, [], [])),
        __import__("marshal").dumps((1, [], {}, b"/", 0, [])),  # the first protocol's shape
    ],
)
def test_garbage_is_not_a_request(body: bytes) -> None:
    with pytest.raises(ValueError):
        wire.decode_request(body)


def test_a_request_with_fields_of_the_wrong_type_is_refused() -> None:
    import marshal

    with pytest.raises(ValueError, match="wrong types"):
        wire.decode_request(marshal.dumps((wire.PROTOCOL, ["str"], {}, b"/", 0, [], [])))
    with pytest.raises(ValueError, match="wrong types"):  # SIGKILL can never be ignored
        wire.decode_request(marshal.dumps((wire.PROTOCOL, [], {}, b"/", 0, [], [9])))


def test_the_socket_is_in_a_directory_of_this_user_alone(tmp_path: Path) -> None:
    found = wire.socket_path({"XDG_RUNTIME_DIR": str(tmp_path)}, "/pkg")
    assert found is not None and Path(found).parent == tmp_path / f"allocator-{os.getuid()}"
    assert oct(Path(found).parent.stat().st_mode & 0o777) == "0o700"
    assert wire.socket_path({"XDG_RUNTIME_DIR": str(tmp_path)}, "/other") != found
    os.chmod(Path(found).parent, 0o755)
    assert wire.socket_path({"XDG_RUNTIME_DIR": str(tmp_path)}, "/pkg") is None
    link = tmp_path / "link"
    (link / f"allocator-{os.getuid()}").parent.mkdir()
    os.rmdir(link)
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    planted = tmp_path / "planted"
    planted.mkdir()
    os.symlink(tmp_path / "elsewhere", planted / f"allocator-{os.getuid()}")
    assert wire.socket_path({"XDG_RUNTIME_DIR": str(planted)}, "/pkg") is None


def test_a_path_too_long_for_a_socket_is_none(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    assert wire.socket_path({"XDG_RUNTIME_DIR": str(deep)}, "/pkg") is None


def test_off_means_off() -> None:
    assert not wire.enabled({"ALLOCATOR_SERVER": "0"})
    assert not wire.enabled({"ALLOCATOR_SERVER": "off"})
    assert wire.enabled({}) == (os.uname().sysname == "Linux")


def test_a_client_in_another_cgroup_finds_a_server_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    environ = {"XDG_RUNTIME_DIR": str(tmp_path)}
    here = wire.socket_path(environ, "/pkg")
    assert wire.socket_path(environ, "/pkg") == here
    monkeypatch.setattr(wire, "own_cgroup", lambda: b"0::/user.slice/session-7.scope\n")
    elsewhere = wire.socket_path(environ, "/pkg")
    assert elsewhere is not None and elsewhere != here
    assert wire.own_cgroup() != (Path("/proc/self/cgroup").read_bytes())


def test_own_cgroup_is_the_kernels_list() -> None:
    assert wire.own_cgroup() == Path("/proc/self/cgroup").read_bytes()


def test_python_and_python3_of_one_environment_find_one_server(tmp_path: Path) -> None:
    import subprocess
    import sys

    environ = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    probe = (
        "import os; from allocator.resident import wire; print(wire.socket_path(os.environ, '/p'))"
    )
    found = set()
    for name in ("python", "python3"):
        interpreter = Path(sys.executable).parent / name
        if interpreter.exists():
            done = subprocess.run(
                [str(interpreter), "-c", probe], env=environ, capture_output=True, text=True
            )
            found.add(done.stdout.strip())
    assert len(found) == 1, found
