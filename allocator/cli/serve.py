"""``allocator serve``: a read-only status page, JSON API and fleet metrics over HTTP."""

from __future__ import annotations

import argparse
from typing import Any

from allocator.cli.common import add_common_options, warn_of_secrets_in_argv

__all__ = ["DEFAULT_LISTEN", "default_allowed_hosts", "parse_listen", "register"]

DEFAULT_LISTEN = "127.0.0.1:8080"
#: Connections served at once (event streams included); more get 503 at once.
DEFAULT_MAX_CONNECTIONS = 256
#: A client's share (its open pages' event streams included): one client never takes them all.
DEFAULT_MAX_CLIENT_CONNECTIONS = 32
#: Seconds a connection has to send a whole request head.
DEFAULT_REQUEST_TIMEOUT = 10.0


def register(commands: Any) -> None:
    """Add the ``serve`` command."""
    parser = commands.add_parser(
        "serve",
        help="serve a live status page, a JSON API and fleet metrics (read-only)",
        description="A web page of every host's GPUs (holder, since, reason, health, idle time, "
        "unassigned processes, agent liveness), the jobs and the history, updated live from "
        "the store's watch; /api/v1/status and /api/v1/history answer what `status -o json` "
        "and `history -o json` print (status with its filters, by pages); /api/v1/fleet, "
        "/api/v1/hosts/HOST, /api/v1/summary and /api/v1/series serve a fleet overview; "
        "/metrics has fleet-level Prometheus series. Needs "
        "`pip install 'gpu-allocator[serve]'`. It only reads: give it a read-only credential.",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to listen on (default: {DEFAULT_LISTEN}; [::1]:8080 for IPv6)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        metavar="NAME",
        help="a Host name the page is served under (repeatable; *.example.com patterns; '*' "
        "for any). Default: the --listen address, localhost and this machine's names. Other "
        "names get 400, so a DNS-rebinding page cannot read the API",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"connections served at once, open pages included; more get 503 "
        f"(default {DEFAULT_MAX_CONNECTIONS})",
    )
    parser.add_argument(
        "--max-client-connections",
        type=int,
        default=DEFAULT_MAX_CLIENT_CONNECTIONS,
        metavar="N",
        help="connections one client address holds at once; more get 429, so one client "
        f"cannot take every connection (default {DEFAULT_MAX_CLIENT_CONNECTIONS})",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help="a connection that sends no whole request in this time is closed "
        f"(default {DEFAULT_REQUEST_TIMEOUT:g})",
    )
    parser.add_argument(
        "--sample-seconds",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often the fleet's counts are added to /api/v1/series (default 10)",
    )
    parser.add_argument(
        "--series-points",
        type=int,
        default=8640,
        metavar="N",
        help="samples kept in /api/v1/series, the oldest dropped first (default 8640: 24 h "
        "at 10 s)",
    )
    add_common_options(parser)
    parser.set_defaults(handler=run)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) as (host, port); InvalidInput when it is neither."""
    from allocator.errors import InvalidInput

    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"--listen {text!r}: expected HOST:PORT, like {DEFAULT_LISTEN}")
    return host, int(port)


def run(args: argparse.Namespace) -> int:
    """Bind, then serve until SIGINT/SIGTERM."""
    import os
    import sys

    from allocator.errors import InvalidInput
    from allocator.records.keys import DEFAULT_PREFIX, KeyLayout, validate_prefix
    from allocator.store import open_store, resolve_store_url
    from allocator.store.credentials import redact

    host, port = parse_listen(args.listen)
    if not 1 <= args.max_connections <= 100_000:
        raise InvalidInput(f"--max-connections {args.max_connections}: expected 1 to 100000")
    if not 1 <= args.max_client_connections <= 100_000:
        raise InvalidInput(
            f"--max-client-connections {args.max_client_connections}: expected 1 to 100000"
        )
    if not 0.1 <= args.request_timeout <= 3600:
        raise InvalidInput(f"--request-timeout {args.request_timeout:g}: expected 0.1 to 3600")
    if not 0.1 <= args.sample_seconds <= 86400:
        raise InvalidInput(f"--sample-seconds {args.sample_seconds:g}: expected 0.1 to 86400")
    if not 1 <= args.series_points <= 1_000_000:
        raise InvalidInput(f"--series-points {args.series_points}: expected 1 to 1000000")
    try:
        import uvicorn

        from allocator.serve.app import build_app
        from allocator.serve.fleet import Fleet
        from allocator.serve.guard import guarded_protocol
        from allocator.serve.mirror import FleetMirror
        from allocator.serve.series import Series
    except ImportError as exc:
        raise InvalidInput(
            f"allocator serve needs its web stack ({exc.name} is missing): "
            "pip install 'gpu-allocator[serve]'"
        ) from None
    url = resolve_store_url(getattr(args, "store", None))
    open_store(url).close()  # a malformed URL or credential is refused now, exit 2
    warn_of_secrets_in_argv(args)
    prefix = validate_prefix(
        getattr(args, "prefix", None) or os.environ.get("ALLOCATOR_PREFIX") or DEFAULT_PREFIX
    )
    sock = _bind(host, port)
    series = Series(args.sample_seconds, args.series_points)
    mirror = FleetMirror(KeyLayout(prefix))
    fleet = Fleet(lambda: open_store(url), mirror, redact(url), series=series)
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"allocator serve: http://{shown}:{port}/ (store {redact(url)})\n")
    config = uvicorn.Config(
        build_app(fleet, args.allowed_host or default_allowed_hosts(host)),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        http=guarded_protocol(args.request_timeout, args.max_client_connections),
        limit_concurrency=args.max_connections,
        timeout_keep_alive=5,
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            fleet.end_streams()  # open event streams never end by themselves
            super().handle_exit(sig, frame)

    Server(config).run(sockets=[sock])
    return 0


def default_allowed_hosts(listen: str) -> list[str]:
    """The Host names served by default: the listen address, localhost, this machine's names."""
    import os

    from allocator.util.identity import local_hostname

    # The names the machine gives itself; no DNS lookup (a slow resolver would delay start-up).
    names = {"localhost", "127.0.0.1", "[::1]", local_hostname(), os.uname().nodename}
    if listen not in ("0.0.0.0", "::", ""):
        names.add(f"[{listen}]" if ":" in listen else listen)
    return sorted(name.lower() for name in names if name)


def _bind(host: str, port: int) -> Any:
    """A listening socket, or one clear line (exit 2) when the address cannot be had."""
    import socket

    from allocator.errors import InvalidInput

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"--listen {host}:{port}: {exc.strerror or exc}") from None
    return sock
