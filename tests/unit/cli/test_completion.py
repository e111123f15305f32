"""Shell completion: real interactive bash and zsh in a pseudo-terminal, names from the store."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.cli import main
from allocator.cli.completion import WORD_KEYS
from tests.support.blackhole import Blackhole

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config" / "policy.example.yaml"
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]|[\r\x07]")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite store: the example policy (jobs train, eval-nightly; hosts node1, node2)."""
    url = f"sqlite://{tmp_path_factory.mktemp('completion') / 'store.db'}"
    assert main(["policy", "apply", str(EXAMPLE), "--store", url]) == 0
    assert main(["set", "job=notebook", "count=1", "host=node1", "--store", url]) == 0
    return url


@pytest.mark.parametrize("command", sorted(WORD_KEYS))
def test_the_keys_offered_are_the_keys_each_command_takes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "zzzzzzzz=1", "--store", "sqlite:///nonexistent/x.db"]) == 2
    taken = re.search(r"\(keys: ([a-z, ]+)\)", capsys.readouterr().err)
    assert taken is not None
    assert tuple(taken.group(1).split(", ")) == WORD_KEYS[command]


def test_names_come_from_the_policy_and_the_job_index(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", "names", "job", "--store", store]) == 0
    assert capsys.readouterr().out.split() == ["eval-nightly", "notebook", "serve", "train"]
    assert main(["completion", "names", "host", "--store", store]) == 0
    assert capsys.readouterr().out.split() == ["node1", "node2", "node3"]


def test_names_from_a_store_that_does_not_answer_are_none_and_no_error() -> None:
    hole = Blackhole()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "allocator", "completion", "names", "job"],
            env={**os.environ, "ALLOCATOR_STORE": f"etcd://{hole.endpoint}"},
            capture_output=True,
            text=True,
            timeout=20,  # a hang fails here; the command itself gives up long before
            check=False,
        )
    finally:
        hole.close()
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_names_from_a_missing_store_are_none_and_create_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "x.db"
    assert main(["completion", "names", "host", "--store", f"sqlite://{missing}"]) == 0
    assert not missing.exists()


# --- real shells -----------------------------------------------------------------------------


class Terminal:
    """An interactive shell in a pseudo-terminal, typed at like a person would."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become the shell
            os.execvpe(argv[0], argv, env)
        self.seen = b""

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, marker: str, timeout: float = 20.0) -> str:
        """Read until ``marker`` shows (escape sequences removed); return what came before it."""
        deadline = time.monotonic() + timeout
        wanted = marker.encode()
        while wanted not in ANSI.sub(b"", self.seen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker!r} in {ANSI.sub(b'', self.seen)[-2000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:
                    break
        clean = ANSI.sub(b"", self.seen).decode(errors="replace")
        before, _, after = clean.partition(marker)
        self.seen = after.encode()
        return before

    def completed(self, typed: str) -> str:
        """The line after typing ``typed`` (tabs complete), shown by echoing it."""
        # ctrl-A, then make the line print itself, led by a marker (":42") that only
        # the shell's arithmetic makes: it is in the output, never in what was typed.
        self.type(typed + "\x01" + "echo :$((6*7))\r")
        self.expect(":42allocator")
        return "allocator" + self.expect("\n").rstrip()

    def close(self) -> None:
        os.close(self.fd)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)


def _shell_env(store: str, tmp_path: Path) -> dict[str, str]:
    bindir = Path(sys.executable).parent
    return {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TERM": "dumb",
        "ALLOCATOR_STORE": store,
        "PS1": "$ ",
        "PROMPT": "$ ",
    }


def _script(shell: str, tmp_path: Path) -> Path:
    """``allocator completion SHELL``, written where the shell can read it."""
    result = subprocess.run(
        [sys.executable, "-m", "allocator", "completion", shell],
        capture_output=True,
        text=True,
        check=True,
    )
    path = tmp_path / f"allocator.{shell}"
    path.write_text(result.stdout)
    return path


@pytest.fixture
def bash(store: str, tmp_path: Path) -> Iterator[Terminal]:
    script = _script("bash", tmp_path)
    term = Terminal(["bash", "--norc", "--noprofile", "-i"], _shell_env(store, tmp_path))
    try:
        term.type(f"source {script}; echo READY\r")
        term.expect("READY")
        term.expect("$ ")
        yield term
    finally:
        term.close()


def test_bash_completes_commands_keys_and_names_from_the_store(bash: Terminal) -> None:
    assert bash.completed("allocator hist\t") == "allocator history"
    assert bash.completed("allocator history jo\t") == "allocator history job="
    assert bash.completed("allocator history job=no\t") == "allocator history job=notebook"
    assert bash.completed("allocator set job=train gp\tcp\t") == "allocator set job=train gpus=cpu"
    assert bash.completed("allocator status host=node2 --out\tj\t") == (
        "allocator status host=node2 --output json"
    )
    assert bash.completed("allocator policy vali\t") == "allocator policy validate"


@pytest.fixture
def zsh(store: str, tmp_path: Path) -> Iterator[Terminal]:
    if shutil.which("zsh") is None:
        pytest.fail("zsh is not installed (tools/install-test-servers installs it)")
    script = _script("zsh", tmp_path)
    term = Terminal(["zsh", "-f", "-i"], _shell_env(store, tmp_path))
    try:
        term.type(f'autoload -U compinit && compinit -u -D; eval "$(<{script})"; echo READY\r')
        term.expect("READY")
        term.expect("$ ")
        yield term
    finally:
        term.close()


def test_zsh_completes_commands_keys_and_names_from_the_store(zsh: Terminal) -> None:
    assert zsh.completed("allocator hist\t") == "allocator history"
    assert zsh.completed("allocator history jo\t") == "allocator history job="
    assert zsh.completed("allocator history job=no\t") == "allocator history job=notebook"
    assert zsh.completed("allocator release job=train ho\tnode2\t") == (
        "allocator release job=train host=node2"
    )
    assert zsh.completed("allocator policy vali\t") == "allocator policy validate"
