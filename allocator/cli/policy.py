"""``allocator policy validate|diff|apply|show|schema``: the reviewed policy file.

Warnings (a policy that loads but holds a likely mistake) print as
``allocator: warning: file:line: field: ...`` on stderr; ``validate`` exits 0
with warnings unless ``--strict``, which makes them an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from allocator.cli.common import add_common_options, note, open_allocator, output_format
from allocator.errors import AllocatorError

if TYPE_CHECKING:
    from allocator.control.client import Allocator
    from allocator.policy import Policy, PolicyWarning

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``policy`` and its subcommands."""
    from allocator.cli.common import CliArgumentParser

    parser = commands.add_parser(
        "policy", help="validate, diff, apply and show the policy file", description=__doc__
    )
    sub = parser.add_subparsers(
        dest="policy_command", metavar="SUBCOMMAND", parser_class=CliArgumentParser
    )
    sub.required = True
    validate = sub.add_parser(
        "validate",
        help="check policy files; exit 2 with file:line: field: problem",
        description="Check policy files without reading the store: each problem is one "
        "line, file:line: field: problem, and the exit code is 2. Warnings (a policy that "
        "loads but holds a likely mistake) go to stderr; --strict makes them errors.",
    )
    validate.add_argument("file", nargs="+", help="policy file(s)")
    validate.add_argument("--strict", action="store_true", help="treat warnings as errors (exit 2)")
    validate.set_defaults(handler=run_validate)
    diff = sub.add_parser(
        "diff",
        help="compare a policy file with the applied one",
        description="Show what applying the file would change, and which current "
        "assignments it would refuse (so `apply` would exit 3). --exit-code: exit 3 "
        "when the file differs from the applied policy, as `git diff --exit-code` does.",
    )
    diff.add_argument("file")
    diff.add_argument("--exit-code", action="store_true", help="exit 3 when the file differs")
    diff.set_defaults(handler=run_diff)
    apply = sub.add_parser(
        "apply",
        help="validate and store a policy file as the applied policy "
        "(exit 3 if current assignments conflict, or one is made meanwhile)",
        description="Validate the file and store it as the applied policy, in one "
        "transaction that checks every current assignment still fits it (exit 3 naming "
        "those that do not, unless --force). The change is kept in `allocator history`.",
    )
    apply.add_argument("file")
    apply.add_argument(
        "--force", action="store_true", help="apply even if current assignments would break it"
    )
    apply.add_argument(
        "--reason", default="", help="why (a ticket, a pull request): kept in `allocator history`"
    )
    apply.set_defaults(handler=run_apply)
    show = sub.add_parser(
        "show",
        help="print the applied policy and who applied it (exit 6 if none is)",
        description="Print the applied policy as it was applied (its YAML), with who "
        "applied it, when, and its SHA-256. Exit 6 when no policy is applied.",
    )
    show.set_defaults(handler=run_show)
    schema = sub.add_parser(
        "schema",
        help="print the policy file's JSON Schema",
        description="Print the JSON Schema of the policy file (for editors and CI "
        "linters); the store is not read.",
    )
    schema.set_defaults(handler=run_schema)
    for p in (diff, apply, show):
        add_common_options(p)
    add_common_options(validate, store=False)  # reads files only


def _read(path: str) -> str:
    from allocator.policy import read_policy_text

    return read_policy_text(path)


def _lint(path: str) -> tuple[str, Policy, tuple[PolicyWarning, ...]]:
    """The file's text, its policy and the warnings about it now (``PolicyError`` if invalid)."""
    from allocator.policy import lint_policy
    from allocator.util.times import utc_now

    text = _read(path)
    policy, warnings = lint_policy(text, path, utc_now())
    return text, policy, warnings


def _warn(message: str) -> None:
    from allocator.cli.common import warn

    warn(message)


def _error_line(code: int, message: str) -> None:
    """The JSON error object on stderr, for a refusal whose details went to stdout."""
    import sys

    from allocator.cli import error_document

    sys.stderr.write(json.dumps(error_document(code, message), sort_keys=True) + "\n")


def run_validate(args: argparse.Namespace) -> int:
    """Validate each file without touching any store; warnings exit 2 only with ``--strict``.

    With several files (a pre-commit hook passes every changed one), each is
    reported and the exit code is 2 if any is refused; ``-o json`` then
    prints a list of the per-file documents.
    """
    from allocator.cli.output import emit

    fmt = output_format(args)
    if fmt != "table":
        results = [_validation(path, args.strict) for path in args.file]
        for _, refusal in results:
            if refusal is not None:
                _error_line(refusal.exit_code, str(refusal))
        documents = [document for document, _ in results]
        emit(documents[0] if len(documents) == 1 else documents, fmt)
        return max((r.exit_code for _, r in results if r is not None), default=0)
    if len(args.file) == 1:
        return _validate_table(args.file[0], args.strict)
    worst = 0
    for path in args.file:
        try:
            worst = max(worst, _validate_table(path, args.strict))
        except AllocatorError as exc:  # one line per refused file; the others still checked
            _fail_line(exc)
            worst = max(worst, exc.exit_code)
    return worst


def _validation(path: str, strict: bool) -> tuple[dict[str, Any], AllocatorError | None]:
    """The JSON document of one file's validation, and the refusal if it is refused."""
    from allocator.errors import InvalidInput, PolicyError

    try:
        _, _, warnings = _lint(path)
    except PolicyError as exc:
        errors = [e.to_dict() for e in exc.errors]
        return {"valid": False, "file": path, "errors": errors, "warnings": []}, exc
    except AllocatorError as exc:  # unreadable: no line or field to name
        error = {"file": path, "line": None, "field": None, "message": str(exc), "error": str(exc)}
        return {"valid": False, "file": path, "errors": [error], "warnings": []}, exc
    refused = bool(warnings) and strict
    document = {
        "valid": not refused,
        "file": path,
        "errors": [],
        "warnings": [w.to_dict() for w in warnings],
    }
    refusal = InvalidInput(f"{warnings[0]} (a warning, refused by --strict)") if refused else None
    return document, refusal


def _validate_table(path: str, strict: bool) -> int:
    from allocator.cli.output import emit
    from allocator.errors import InvalidInput

    _, policy, warnings = _lint(path)
    if warnings and strict:
        more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
        raise InvalidInput(f"{warnings[0]} (a warning, refused by --strict){more}")
    for warning in warnings:
        _warn(str(warning))
    summary = (
        f"{path}: ok ({len(policy.hosts)} hosts, {len(policy.pools)} pools, "
        f"{len(policy.reservations)} reservations, {len(policy.jobs)} jobs"
        + (f"; {len(warnings)} warning(s)" if warnings else "")
        + ")"
    )
    emit({}, "table", summary)
    return 0


def _fail_line(exc: AllocatorError) -> None:
    import sys

    from allocator.store.credentials import redact
    from allocator.util.printable import one_line

    sys.stderr.write(f"allocator: error: {one_line(redact(str(exc)))}\n")


def run_diff(args: argparse.Namespace) -> int:
    """Show the unified diff between the applied policy and FILE, and what it would break."""
    import difflib

    from allocator.cli.output import emit
    from allocator.policy import load_policy

    text = _read(args.file)
    policy = load_policy(text, source=args.file)
    allocator = open_allocator(args)
    try:
        snapshot = allocator.policy()
        violations = allocator.violations(policy)
        upcoming = _upcoming(allocator, policy)
    finally:
        allocator.store.close()
    applied = snapshot.record.yaml if snapshot else ""
    lines = list(
        difflib.unified_diff(
            applied.splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile="applied" if snapshot else "(nothing applied)",
            tofile=args.file,
        )
    )
    changed = bool(lines)
    body = "".join(lines) if changed else f"{args.file}: same as the applied policy\n"
    hosts = _hosts_changed(snapshot.policy if snapshot else None, policy)
    if changed:
        body += _hosts_line(hosts)
    if violations:
        body += "\n".join(f"would conflict: {v}" for v in violations) + "\n"
    if upcoming:
        body += "\n".join(f"will conflict when its window opens: {u}" for u in upcoming) + "\n"
    data = {
        "changed": changed,
        "diff": "".join(lines),
        "conflicts": violations,
        "upcoming_conflicts": upcoming,
        "hosts_changed": hosts,
    }
    emit(data, output_format(args), body.rstrip("\n"))
    return 3 if changed and args.exit_code else 0


def _hosts_changed(applied: Policy | None, policy: Policy) -> list[str] | None:
    """The hosts whose placement ``policy`` changes (sorted); ``None``: every host."""
    from allocator.control.apply.scope import affected_hosts

    hosts = affected_hosts(applied, policy)
    return None if hosts is None else sorted(hosts)


def _hosts_line(hosts: list[str] | None, shown: int = 10) -> str:
    """One line naming the hosts a change affects (a range edit can name thousands)."""
    if hosts is None:
        return "hosts changed: every host (apply checks them all)\n"
    if not hosts:
        return "hosts changed: none\n"
    more = f" and {len(hosts) - shown:,} more" if len(hosts) > shown else ""
    return f"hosts changed: {', '.join(hosts[:shown])}{more}\n"


def _upcoming(allocator: Allocator, policy: Policy) -> list[str]:
    """Held GPUs that ``policy``'s reservations take from their holders later.

    Only the reserved hosts are read: a fleet's other hosts cannot conflict.
    """
    from allocator.control.apply.scope import read_hosts
    from allocator.placement.reservations import upcoming_conflicts
    from allocator.status.snapshots import snapshots_by_host

    reserved = {reservation.host for reservation in policy.reservations}
    now = allocator.clock()
    found: list[str] = []
    for items in read_hosts(allocator.store, allocator.layout, reserved):
        for host, state in sorted(snapshots_by_host(items, allocator.layout, 0).items()):
            held = {job: a.gpus for job, a in state.assignments.items() if a.mode == "gpu"}
            found += upcoming_conflicts(policy, host, held, now)
    return found


def run_apply(args: argparse.Namespace) -> int:
    """Store FILE as the applied policy, atomically; report what it leaves in conflict."""
    from allocator.cli.args import parse_reason
    from allocator.cli.output import emit

    reason = parse_reason(args.reason)
    text, policy, lints = _lint(args.file)  # a bad file is refused before the store is opened
    allocator = open_allocator(args, create=True)  # nothing is created unless it applies
    try:
        result = allocator.apply_policy(text, source=args.file, force=args.force, reason=reason)
        # Re-applying the applied file writes nothing, but must still say what breaks it now.
        standing = [] if result.changed else allocator.violations(policy)
        upcoming = _upcoming(allocator, policy)
    finally:
        allocator.store.close()
    for lint in lints:
        _warn(str(lint))
    for warning in result.warnings:
        note(f"applied over a conflicting assignment (--force): {warning}")
    if not result.compiled:
        note(
            "stored without its compiled form (too large to share the transaction, or this "
            f"user may not write {allocator.layout.compiled_policy}): commands will parse the YAML"
        )
    if not result.shares:
        note(
            f"stored without its shares (this user may not write {allocator.layout.shares}): "
            "agents will read the whole policy"
        )
    for conflict in standing:
        _warn(f"the applied policy is broken by a current assignment: {conflict}")
    for conflict in upcoming:
        _warn(f"will conflict when its reservation window opens: {conflict}")
    verb = "applied" if result.changed else "unchanged"
    summary = f"{verb} {args.file} (sha256 {result.record.sha256[:12]}, revision {result.revision})"
    data = {
        "changed": result.changed,
        "sha256": result.record.sha256,
        "revision": result.revision,
        "applied_by": result.record.applied_by,
        "applied_at": result.record.applied_at,
    }
    emit(data, output_format(args), summary)
    return 0


def run_show(args: argparse.Namespace) -> int:
    """Print the applied policy (YAML text as applied; JSON/YAML with metadata)."""
    from allocator.cli.output import emit
    from allocator.errors import NotFound
    from allocator.policy import policy_to_dict
    from allocator.util.printable import printable

    allocator = open_allocator(args)
    try:
        snapshot = allocator.policy()
    finally:
        allocator.store.close()
    if snapshot is None:
        raise NotFound("no policy applied yet: run `allocator policy apply FILE`")
    record = snapshot.record
    data = {
        "sha256": record.sha256,
        "applied_by": record.applied_by,
        "applied_at": record.applied_at,
        "source": record.source,
        "revision": snapshot.revision,
        "policy": policy_to_dict(snapshot.policy),
    }
    header = printable(
        f"# applied {record.applied_at} by {record.applied_by} from {record.source} "
        f"(sha256 {record.sha256[:12]})"
    )
    emit(data, output_format(args), f"{header}\n{record.yaml}", keep="\n\t")
    return 0


def run_schema(args: argparse.Namespace) -> int:
    """Print the JSON Schema (what config/policy.schema.json holds)."""
    from allocator.policy import policy_json_schema

    print(json.dumps(policy_json_schema(), indent=2, sort_keys=True))
    return 0
