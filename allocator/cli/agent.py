"""``allocator agent``: the host agent (run it under systemd or docker compose)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``agent`` command."""
    parser = commands.add_parser(
        "agent",
        help="run the host agent: watch this host's assignments and supervise workers",
        description="Watch this host's assignments and the policy; run each assigned job's "
        "workers with CUDA_VISIBLE_DEVICES set before they start; publish inventory, health "
        "and worker state. SIGTERM stops workers gracefully (unless --keep-workers-on-exit); "
        "SIGHUP re-reads the config and inventory without restarting workers. Under systemd "
        "(Type=notify) it reports ready once it has adopted its workers and pings the "
        "watchdog (WatchdogSec=) from its supervision loop.",
    )
    parser.add_argument("--host", help="this host's name in the policy (default: the host name)")
    parser.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        help="store URL (default: $ALLOCATOR_STORE, else local sqlite)",
    )
    parser.add_argument(
        "--prefix",
        default=argparse.SUPPRESS,
        help="key prefix (default: $ALLOCATOR_PREFIX or /allocator)",
    )
    parser.add_argument("--config", help="agent settings file (YAML)")
    parser.add_argument("--state-dir", help="where the agent keeps its state (adoption)")
    parser.add_argument("--log-dir", help="where each job's stdout/stderr go (<job>.log)")
    parser.add_argument("--log-format", choices=("text", "json"), help="decision log format")
    parser.add_argument(
        "--master-addr",
        help="MASTER_ADDR of this host's per-gpu jobs (default 127.0.0.1), and the address "
        "other hosts reach this one at for jobs across hosts (default: the host name)",
    )
    parser.add_argument(
        "--keep-workers-on-exit",
        action="store_true",
        default=None,
        help="leave workers running when the agent stops (a restarted agent adopts them)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port at /metrics (default: off)",
    )
    parser.add_argument(
        "--metrics-address",
        metavar="ADDR",
        help="address the metrics port listens on (default: 0.0.0.0, every interface)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the settings and run the agent until SIGTERM."""
    import os

    from allocator.agent.config import load_agent_config
    from allocator.agent.daemon import Agent

    overrides = {
        "host": args.host,
        "store": getattr(args, "store", None),
        "prefix": getattr(args, "prefix", None) or os.environ.get("ALLOCATOR_PREFIX"),
        "state_dir": args.state_dir,
        "log_dir": args.log_dir,
        "log_format": args.log_format,
        "master_addr": args.master_addr,
        "keep_workers_on_exit": args.keep_workers_on_exit,
        "metrics_port": args.metrics_port,
        "metrics_address": args.metrics_address,
    }
    config = load_agent_config(args.config, overrides)
    _check_store_url(config.store)
    from allocator.cli.common import warn_of_secrets_in_argv

    warn_of_secrets_in_argv(args)
    # SIGHUP re-reads the same file with the same flags on top.
    return Agent(config, reload_config=lambda: load_agent_config(args.config, overrides)).run()


def _check_store_url(explicit: str | None) -> None:
    """Refuse a malformed store URL now (exit 2), rather than retrying it forever.

    Opening a store does no network I/O; only the URL, credentials and TLS
    files are checked. A store that cannot be reached is the agent's to retry.
    """
    from allocator.errors import StoreConfigError, StoreError
    from allocator.store import open_store, resolve_store_url

    try:
        open_store(resolve_store_url(explicit)).close()
    except StoreConfigError:
        raise
    except StoreError:
        pass
