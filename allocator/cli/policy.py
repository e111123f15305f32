"""``allocator policy validate|diff|apply|show|schema``: the reviewed policy file."""

from __future__ import annotations

import argparse
import json
from typing import Any

from allocator.cli.common import add_common_options, note, open_allocator, output_format

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
        "validate", help="check a policy file; exit 2 with file:line: field: problem"
    )
    validate.add_argument("file")
    validate.set_defaults(handler=run_validate)
    diff = sub.add_parser("diff", help="compare a policy file with the applied one")
    diff.add_argument("file")
    diff.add_argument("--exit-code", action="store_true", help="exit 3 when the file differs")
    diff.set_defaults(handler=run_diff)
    apply = sub.add_parser(
        "apply",
        help="validate and store a policy file as the applied policy "
        "(exit 3 if current assignments conflict, or one is made meanwhile)",
    )
    apply.add_argument("file")
    apply.add_argument(
        "--force", action="store_true", help="apply even if current assignments would break it"
    )
    apply.set_defaults(handler=run_apply)
    show = sub.add_parser(
        "show", help="print the applied policy and who applied it (exit 6 if none is)"
    )
    show.set_defaults(handler=run_show)
    schema = sub.add_parser("schema", help="print the policy file's JSON Schema")
    schema.set_defaults(handler=run_schema)
    for p in (validate, diff, apply, show, schema):
        add_common_options(p)


def _read(path: str) -> str:
    from allocator.policy import read_policy_text

    return read_policy_text(path)


def run_validate(args: argparse.Namespace) -> int:
    """Validate without touching any store."""
    from allocator.cli.output import emit
    from allocator.errors import PolicyError
    from allocator.policy import load_policy

    try:
        policy = load_policy(_read(args.file), source=args.file)
    except PolicyError as exc:
        if output_format(args) == "table":
            raise
        errors = [e.to_dict() for e in exc.errors]
        emit({"valid": False, "file": args.file, "errors": errors}, output_format(args))
        return exc.exit_code
    summary = (
        f"{args.file}: ok ({len(policy.hosts)} hosts, {len(policy.pools)} pools, "
        f"{len(policy.reservations)} reservations, {len(policy.jobs)} jobs)"
    )
    emit({"valid": True, "file": args.file, "errors": []}, output_format(args), summary)
    return 0


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
    if violations:
        body += "\n".join(f"would conflict: {v}" for v in violations) + "\n"
    data = {"changed": changed, "diff": "".join(lines), "conflicts": violations}
    emit(data, output_format(args), body.rstrip("\n"))
    return 3 if changed and args.exit_code else 0


def run_apply(args: argparse.Namespace) -> int:
    """Store FILE as the applied policy, atomically."""
    from allocator.cli.output import emit

    text = _read(args.file)
    allocator = open_allocator(args, create=True)  # nothing is created unless it applies
    try:
        result = allocator.apply_policy(text, source=args.file, force=args.force)
    finally:
        allocator.store.close()
    for warning in result.warnings:
        note(f"applied over a conflicting assignment (--force): {warning}")
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
    header = (
        f"# applied {record.applied_at} by {record.applied_by} from {record.source} "
        f"(sha256 {record.sha256[:12]})\n"
    )
    emit(data, output_format(args), header + record.yaml)
    return 0


def run_schema(args: argparse.Namespace) -> int:
    """Print the JSON Schema (what config/policy.schema.json holds)."""
    from allocator.policy import policy_json_schema

    print(json.dumps(policy_json_schema(), indent=2, sort_keys=True))
    return 0
