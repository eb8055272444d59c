"""Text taken from requests and files, made safe to log, print and send back: escaped and bounded.

A request can carry any string and any number of them; echoed as is, a
device ID with a newline forges a log line, a terminal escape rewrites the
operator's screen, and a list of 100 000 unknown IDs makes a megabyte log line
and an error message larger than gRPC's metadata limit (the caller then gets
``RESOURCE_EXHAUSTED`` instead of the error). Everything devplug repeats from
outside goes through these helpers:

* :func:`escape` -- control and other non-printable characters as Python
  escapes (``\\n``, ``\\x1b``, ``\\u2028``);
* :func:`shorten` -- :func:`escape`, then at most ``limit`` characters with
  the original length said;
* :func:`id_list` -- the first :data:`LISTED_IDS` items, each shortened, and
  how many more there were;
* :func:`bounded` -- a whole message cut to a byte budget (for gRPC status
  details, which travel as percent-encoded metadata).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ID_SHOWN_CHARS", "LISTED_IDS", "MESSAGE_BYTES", "bounded", "escape", "id_list", "shorten"]

#: How many items :func:`id_list` names before it only counts.
LISTED_IDS = 10
#: How many characters of one ID :func:`id_list` shows.
ID_SHOWN_CHARS = 64
#: The byte budget of an error message sent back over gRPC: even fully percent-encoded (x3) it stays
#: under gRPC's default 8 KiB metadata limit.
MESSAGE_BYTES = 2048

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(text: str) -> str:
    """``text`` with every non-printable character escaped (a newline as ``\\n``, ESC as ``\\x1b``)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def shorten(text: str, limit: int = ID_SHOWN_CHARS) -> str:
    """:func:`escape` ``text``, cut to ``limit`` characters; a cut says the original length."""
    if len(text) > limit:
        return f"{escape(text[:limit])}...({len(text)} chars)"
    return escape(text)


def id_list(ids: Sequence[str], limit: int = LISTED_IDS) -> str:
    """``"a, b, c"``; past ``limit`` items ``"a, b, ... and 99990 more"``; every item shortened and escaped."""
    shown = ", ".join(shorten(i) for i in ids[:limit])
    if len(ids) > limit:
        return f"{shown} and {len(ids) - limit} more"
    return shown


def bounded(message: str, max_bytes: int = MESSAGE_BYTES) -> str:
    """``message`` escaped and cut to at most ``max_bytes`` bytes of UTF-8 (saying so when cut)."""
    text = escape(message)
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    suffix = f"... ({len(data)} bytes, cut)"
    kept = data[: max_bytes - len(suffix)].decode(errors="ignore")
    return kept + suffix
