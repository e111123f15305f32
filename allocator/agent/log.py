"""One structured line per agent decision, as text (key=value) or JSON.

Every field passes through :func:`allocator.store.credentials.redact` before it is
formatted, so no log line can carry a store password or token, whichever
call site logs a URL or an error message that quotes one.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TextIO

from allocator.store.credentials import redact
from allocator.util.times import format_time, utc_now

__all__ = ["DecisionLog", "as_fields"]


def _text_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text)
    return text


class DecisionLog:
    """Write ``event`` and its fields as one line to ``stream`` (stderr by default)."""

    def __init__(
        self,
        fmt: str,
        host: str,
        *,
        stream: TextIO | None = None,
        wall: Callable[[], datetime] = utc_now,
    ) -> None:
        self.fmt = fmt
        self.host = host
        self._stream = stream or sys.stderr
        self._wall = wall
        # The store link and GPU probes log from their own threads: one line at a time.
        self._lock = threading.Lock()

    def __call__(self, event: str, fields: Mapping[str, Any] | None = None) -> None:
        """Log one decision or observation."""
        record = {
            "ts": format_time(self._wall()),
            "host": self.host,
            "event": event,
            **{str(k): _redacted(v) for k, v in (fields or {}).items()},
        }
        if self.fmt == "json":
            line = json.dumps(record, sort_keys=False, default=str)
        else:
            line = " ".join(f"{k}={_text_value(v)}" for k, v in record.items() if v is not None)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


def _redacted(value: Any) -> Any:
    """``value`` with secrets masked in every string it holds (numbers pass unchanged)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {str(k): _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(v) for v in value]
    return redact(str(value))


def as_fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict (anything else as its text)."""
    if hasattr(obj, "__dataclass_fields__"):
        return {name: getattr(obj, name) for name in obj.__dataclass_fields__}
    return {"detail": str(obj)}
