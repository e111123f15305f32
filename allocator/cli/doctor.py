"""``allocator doctor``: the GPU-debugging checklist in one command.

Each finding is one line (ok / warn / fail) with what to do about it; the exit
code is 0 unless something failed.
"""

from __future__ import annotations

import argparse
from typing import Any

from allocator.cli.common import add_words_command, open_allocator, output_format

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``doctor`` command."""
    parser = add_words_command(
        commands,
        "doctor",
        run,
        help="check NVML, driver vs torch CUDA, the environment, the store and the agent",
        usage="allocator doctor [host=H] [--no-torch]",
        description=__doc__,
    )
    parser.add_argument("--no-torch", action="store_true", help="skip the torch subprocess check")


def run(args: argparse.Namespace) -> int:
    """Run every check and print the findings; exit 3 if any check failed."""
    import os

    from allocator.cli.args import parse_key_values
    from allocator.cli.output import emit, render_table
    from allocator.doctor.checks import Finding, overall, run_checks
    from allocator.errors import EXIT_INVALID, AllocatorError
    from allocator.records.keys import validate_name
    from allocator.util.identity import local_hostname

    kv = parse_key_values(args.words, ("host",))
    state: dict[str, Any] = {}
    try:
        allocator = open_allocator(args)
    except AllocatorError as exc:
        if exc.exit_code == EXIT_INVALID:
            raise
        allocator, state["store_error"] = None, exc
    try:
        policy = _policy(allocator, state)
        host = validate_name(kv["host"], "host") if "host" in kv else _host(allocator, policy)
        findings = run_checks(
            policy,
            host,
            dict(os.environ),
            lambda: _store_finding(allocator, state, Finding),
            None if allocator is None or "store_error" in state else _agent_check(allocator, host),
            check_torch=not args.no_torch,
        )
    finally:
        if allocator is not None:
            allocator.store.close()
    rows = [
        [f.status.upper(), f.check, f.message + (f" -> {f.hint}" if f.hint else "")]
        for f in findings
    ]
    data = {
        "host": host or local_hostname(),
        "status": overall(findings),
        "findings": [{**f.to_dict(), "hint": f.hint or None} for f in findings],
    }
    emit(data, output_format(args), render_table(["STATUS", "CHECK", "FINDING"], rows))
    return 0 if overall(findings) != "fail" else 3


def _agent_check(allocator: Any, host: str) -> Any:
    from allocator.doctor.checks import Finding

    return lambda: _agent_finding(allocator, host, Finding)


def _policy(allocator: Any, state: dict[str, Any]) -> Any:
    from allocator.errors import AllocatorError

    if allocator is None:
        return None
    try:
        snapshot = allocator.policy()
    except AllocatorError as exc:
        state["store_error"] = exc
        return None
    state["policy_applied"] = snapshot is not None
    return snapshot.policy if snapshot is not None else None


def _host(allocator: Any, policy: Any) -> str:
    from allocator.util.identity import local_hostname

    return str(allocator.default_host(policy)) if allocator is not None else local_hostname()


def _store_finding(allocator: Any, state: dict[str, Any], finding: Any) -> Any:
    error = state.get("store_error")
    if error is not None:
        return finding(
            "fail", "store", str(error), "check ALLOCATOR_STORE / --store and the server"
        )
    url = allocator.store.url
    if not state.get("policy_applied"):
        return finding(
            "warn",
            "store",
            f"{url} reachable, but no policy applied",
            "allocator policy apply FILE",
        )
    return finding("ok", "store", f"{url} reachable, policy applied")


def _agent_finding(allocator: Any, host: str, finding: Any) -> Any:
    from allocator.status.join import build_status
    from allocator.util.times import utc_now

    listing = allocator.store.list(allocator.layout.host(host))
    snapshot = allocator.policy()
    (status,) = build_status(
        snapshot.policy if snapshot else None, listing.items, allocator.layout, utc_now(), host
    )
    if status.agent == "alive":
        return finding("ok", "agent", f"agent on {host} is alive")
    if status.agent == "stale":
        return finding(
            "warn",
            "agent",
            f"agent on {host} is running but cannot read its assignments (stale view)",
            "check the agent's store permissions and `journalctl -u allocator-agent`",
        )
    return finding(
        "fail", "agent", f"no agent running for {host}", "start it: systemctl start allocator-agent"
    )
