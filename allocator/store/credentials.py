"""Store credentials: kept out of output, logs and the environments workers start with.

Two rules live here, so every place that prints or spawns follows the same:

* :func:`redact` masks URL passwords, secret query values (``?token=``) and
  every secret this process has learned (:func:`remember_url`,
  :func:`remember_secret`: the store backends register the password and
  token they connect with) in any text about to be printed or logged.
* :func:`strip_store_credentials` removes from an environment every
  variable a worker must not inherit from the agent: a job that could read
  the agent's store credentials could rewrite every host's assignments.

What a worker never sees (names are matched exactly unless marked as a prefix):

* ``ALLOCATOR_*`` (prefix): the agent's own settings, ``ALLOCATOR_STORE`` included;
* ``ETCDCTL_*`` (prefix): etcdctl's endpoints, user, password and TLS files;
* ``ETCD_*`` variables naming credentials: any whose name contains
  ``PASSWORD``, ``USER``, ``TOKEN``, ``AUTH``, ``KEY``, ``CERT`` or ``CA``
  (``ETCD_PASSWORD``, ``ETCD_CERT_FILE``, ``ETCD_TRUSTED_CA_FILE``, ...);
* ``CONSUL_HTTP_TOKEN``, ``CONSUL_HTTP_TOKEN_FILE``, ``CONSUL_HTTP_AUTH``,
  ``CONSUL_CLIENT_CERT``, ``CONSUL_CLIENT_KEY``, ``CONSUL_CACERT``,
  ``CONSUL_CAPATH``;
* any variable whose value holds one of the agent's store secrets (the
  password or token of its store URL, ``ETCDCTL_PASSWORD``,
  ``CONSUL_HTTP_TOKEN``, or any secret a backend registered), whatever its
  name: ``MY_URL=etcd://root:pw@...`` goes too.

Everything else is inherited (``PATH``, ``HOME``, proxies, ``CONSUL_HTTP_ADDR``,
the job's own variables), and a job's ``env:`` in the policy is added after.
Secrets shorter than :data:`MIN_MATCH_LENGTH` characters are matched only as
whole values, so a one-letter password cannot blank every variable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from allocator.store.urls import SECRET_WORDS, redact_urls, url_secrets

__all__ = [
    "MASK",
    "MIN_MATCH_LENGTH",
    "STRIPPED_NAMES",
    "STRIPPED_PREFIXES",
    "is_store_credential",
    "known_secrets",
    "redact",
    "redact_args",
    "remember_secret",
    "remember_url",
    "secrets_in_environment",
    "strip_store_credentials",
]

MASK = "***"
#: A secret at least this long is masked wherever it appears; a shorter one
#: only where it is a whole value.
MIN_MATCH_LENGTH = 4
#: Variables a worker never inherits, by exact name.
STRIPPED_NAMES = frozenset(
    {
        "CONSUL_HTTP_TOKEN",
        "CONSUL_HTTP_TOKEN_FILE",
        "CONSUL_HTTP_AUTH",
        "CONSUL_CLIENT_CERT",
        "CONSUL_CLIENT_KEY",
        "CONSUL_CACERT",
        "CONSUL_CAPATH",
    }
)
#: Variables a worker never inherits, by name prefix.
STRIPPED_PREFIXES = ("ALLOCATOR_", "ETCDCTL_")
_ETCD_CREDENTIAL_WORDS = ("PASSWORD", "USER", "TOKEN", "AUTH", "KEY", "CERT", "CA")

_known: set[str] = set()
_known_lock = threading.Lock()


def remember_secret(secret: str | None) -> None:
    """Add ``secret`` to what :func:`redact` masks and workers never inherit."""
    if secret:
        with _known_lock:
            _known.add(secret)


def remember_url(url: str) -> None:
    """Remember the password and secret query values ``url`` carries."""
    for secret in url_secrets(url):
        remember_secret(secret)


def known_secrets() -> frozenset[str]:
    """Every secret remembered so far in this process."""
    with _known_lock:
        return frozenset(_known)


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with URL passwords, secret query values and known secrets masked."""
    text = redact_urls(text)
    for secret in sorted({*known_secrets(), *extra}, key=len, reverse=True):
        if len(secret) >= MIN_MATCH_LENGTH:
            text = text.replace(secret, MASK)
        elif text == secret:
            text = MASK
    return text


def redact_args(argv: Iterable[str]) -> list[str]:
    """A command line as it may be recorded: what :func:`redact` masks, and secret options.

    ``--token=T``, ``TOKEN=T`` (any name holding a secret word, or ending
    in ``key``) keep their name and lose their value; ``--password P``
    loses the word after the option. The command itself never sees this.
    """
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            masked.append(MASK)
            hide_next = False
            continue
        name, equals, _ = arg.partition("=")
        if _names_secret(name):
            masked.append(f"{name}={MASK}" if equals else arg)
            hide_next = not equals and arg.startswith("-")
            continue
        masked.append(redact(arg))
    return masked


def _names_secret(name: str) -> bool:
    """Whether an option or variable name says its value is secret (``--api-key``, ``HF_TOKEN``)."""
    lowered = name.lstrip("-").lower()
    if not lowered or not all(c.isalnum() or c in "_.-" for c in lowered):
        return False  # not a name: a URL, a sentence
    return any(word in lowered for word in SECRET_WORDS) or lowered.endswith("key")


def secrets_in_environment(environ: Mapping[str, str]) -> frozenset[str]:
    """The store secrets an environment carries (ETCDCTL_*, CONSUL_*, ALLOCATOR_STORE)."""
    found: set[str] = set()
    for name in ("ETCDCTL_PASSWORD", "CONSUL_HTTP_TOKEN"):
        found.add(environ.get(name, ""))
    for name in ("ETCDCTL_USER", "CONSUL_HTTP_AUTH"):  # user:password
        found.add(environ.get(name, "").partition(":")[2])
    for name, value in environ.items():
        if name.startswith("ETCD_") and "PASSWORD" in name:
            found.add(value)
    found.update(url_secrets(environ.get("ALLOCATOR_STORE", "")))
    return frozenset(s for s in found if s)


def is_store_credential(name: str, value: str, secrets: Iterable[str] = ()) -> bool:
    """Whether the variable ``name=value`` must be kept from workers (see the module doc)."""
    if name in STRIPPED_NAMES or name.startswith(STRIPPED_PREFIXES):
        return True
    if name.startswith("ETCD_") and any(word in name for word in _ETCD_CREDENTIAL_WORDS):
        return True
    return any(_holds(value, secret) for secret in secrets)


def strip_store_credentials(
    environ: Mapping[str, str], secrets: Iterable[str] = ()
) -> dict[str, str]:
    """``environ`` without any store credential (see the module doc for the list).

    ``secrets`` adds to what the environment itself and this process's
    remembered secrets say the credentials are.
    """
    every = {*secrets, *known_secrets(), *secrets_in_environment(environ)}
    return {
        name: value
        for name, value in environ.items()
        if not is_store_credential(name, value, every)
    }


def _holds(value: str, secret: str) -> bool:
    if not secret:
        return False
    return secret in value if len(secret) >= MIN_MATCH_LENGTH else value == secret
