"""Compact JSON text for the files written on the Allocate path (ledger journal, hook call records).

:func:`compact_json` gives exactly what ``json.dumps(value, separators=(",",
":"), check_circular=False)`` gives, about twice as fast for the small
objects written per call: ``json.dumps`` (and ``JSONEncoder.encode``) build
the C accelerator's encoder anew for every call, and that setup costs as much
as encoding a ledger record. Here the encoder is built once. The accelerator
is CPython's ``json.encoder.c_make_encoder``; where it is missing (another
Python) or takes other arguments, the plain encoder is used.

No cycle check: callers pass plain data built for the call (a cycle ends in
``RecursionError`` rather than ``ValueError``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _stdlib

__all__ = ["compact_json"]

_PLAIN = json.JSONEncoder(separators=(",", ":"), check_circular=False)


def _build() -> Callable[[object], str]:
    make = getattr(_stdlib, "c_make_encoder", None)
    if make is None:
        return _PLAIN.encode
    try:
        # the arguments JSONEncoder.iterencode passes: no markers (no cycle check), the default hook, the string
        # encoder for ensure_ascii, no indent, the separators, sort_keys, skipkeys, allow_nan
        chunks = make(None, _PLAIN.default, _stdlib.encode_basestring_ascii, None, ":", ",", False, False, True)
        if "".join(chunks({"k": [1.5, None]}, 0)) != '{"k":[1.5,null]}':
            return _PLAIN.encode
    except TypeError:  # a Python whose accelerator takes other arguments
        return _PLAIN.encode

    def encode(value: object) -> str:
        if isinstance(value, str):  # as JSONEncoder.encode: the accelerator wants a container or a scalar
            return _stdlib.encode_basestring_ascii(value)
        return "".join(chunks(value, 0))

    return encode


#: ``compact_json(value)``: the JSON text of ``value``, no spaces, ASCII only, keys in insertion order.
compact_json: Callable[[object], str] = _build()
