"""The compact JSON of the Allocate path's files is exactly the standard library's (randomized, seed printed)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from devplug.kit.hookrecord import HookCall, _call_line
from devplug.text.compactjson import compact_json

_ALPHABET = 'ab-_.:/09"\\\x00\x1f\x7f\u00e9\u4e2d\U0001f600 '


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 6)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["str", "int", "float", "bool", "none"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return _text(rng)
    if kind == "int":
        return rng.randrange(-(2**70), 2**70)
    if kind == "float":
        return rng.choice([rng.uniform(-1e9, 1e9), 0.1, 1e-300, float("nan"), float("inf"), -0.0])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def test_compact_json_is_the_standard_librarys_text() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(3000):
        value = _value(rng)
        assert compact_json(value) == json.dumps(value, separators=(",", ":")), f"seed {seed}: {value!r}"


def test_compact_json_refuses_what_json_cannot_encode_naming_the_type() -> None:
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        compact_json({"devices": {"mock0"}})


def test_a_call_line_is_the_text_of_the_calls_json() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(3000):
        ids = tuple(_text(rng) if rng.random() < 0.1 else f"mock{rng.randrange(1000)}" for _ in range(rng.randrange(5)))
        extra_keys = ["size", "must_include", "retry", "error", "replicas"] + (
            ["hook", "time"] if rng.random() < 0.1 else []
        )
        extra = {k: _value(rng) for k in rng.sample(extra_keys, rng.randrange(3))}
        error = rng.choice([None, _text(rng)])
        call = HookCall(
            rng.choice(["allocate", "pre_start", 'x"y']), ids, rng.uniform(0, 2e9), rng.random() < 0.5, error, extra
        )
        expected = json.dumps(call.to_json(), separators=(",", ":")) + "\n"
        assert _call_line(call) == expected.encode(), f"seed {seed}: {call!r}"
