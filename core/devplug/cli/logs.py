"""Log output for the daemon: readable lines by default, one JSON object a line for machines.

Either way a message cannot forge a line: the text format escapes control
characters in it (a device ID holding a newline shows as ``\\n``), and JSON
escapes them by itself.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Literal

from devplug.text.logsafe import escape

__all__ = ["JsonFormatter", "setup_logging"]

LogFormat = Literal["text", "json"]

_PREFIX = re.compile(r"^\[(?P<resource>[^\s\]/]+/[^\s\]]+)(?: (?P<device>[^\]]+))?\] ")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extra}``.

    ``resource`` and ``device`` come as their own keys: from ``extra``, or from
    the ``[resource device]`` prefix every engine and driver line about a
    resource carries.
    """

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        prefix = _PREFIX.match(record.getMessage())
        if prefix:  # "[resource device] ..." as its own keys
            data["resource"] = prefix["resource"]
            if prefix["device"]:
                data["device"] = prefix["device"]
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data)


class _TextFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}"


def setup_logging(level: str = "info", fmt: LogFormat = "text") -> None:
    """Send devplug's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
    logging.getLogger("asyncio").setLevel(logging.WARNING)
