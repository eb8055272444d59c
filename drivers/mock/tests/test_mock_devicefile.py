"""Parsing one mock device file, and the natural order of device IDs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from devplug import Device, Health, Topology
from devplug_mock import devicefile
from devplug_mock.devicefile import is_device_name, natural_key, parse_device_file, read_device_file


def test_an_empty_file_is_a_healthy_device_without_topology() -> None:
    parsed = parse_device_file("mock0", "")
    assert parsed.device == Device("mock0", Health.HEALTHY, Topology())
    assert parsed.problems == ()


def test_health_and_numa() -> None:
    parsed = parse_device_file("mock0", "numa=2\n  unhealthy  \r\n")
    assert parsed.device == Device("mock0", Health.UNHEALTHY, Topology((2,)))


def test_an_unhealthy_line_may_give_the_reason() -> None:
    parsed = parse_device_file("mock0", "unhealthy = ECC errors: 12 uncorrectable\n")
    assert parsed.device == Device("mock0", Health.UNHEALTHY, reason="ECC errors: 12 uncorrectable")
    assert parsed.problems == ()
    too_long = parse_device_file("mock0", "unhealthy=" + "x" * 501)
    assert too_long.device == Device("mock0")
    assert too_long.problems == (
        "line 1: unhealthy=" + "x" * 501 + ": the reason must have 1 to 500 characters; ignored",
    )


def test_several_numa_nodes() -> None:
    assert parse_device_file("mock0", "numa=0, 1,1").numa_nodes == (0, 1)


def test_directives() -> None:
    parsed = parse_device_file(
        "mock0", "fail=allocate, pre_start\ndelay=deallocate:0.5\ncrash=post_stop,deallocate\n# a comment\n\n"
    )
    assert parsed.fail == {"allocate", "pre_start"}
    assert parsed.crash == {"post_stop", "deallocate"}
    assert dict(parsed.delays) == {"deallocate": 0.5}
    assert parsed.problems == ()
    assert parsed.device == Device("mock0")  # directives do not change the device


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("bogus", "unknown directive"),
        ("healthy=no", "unknown directive"),
        ("numa=x", "not a NUMA node"),
        ("numa=-1", "not a NUMA node"),
        ("numa=²", "not a NUMA node"),
        ("fail=list_devices", "unknown hook"),
        ("crash=stop", "unknown hook"),
        ("delay=allocate", "delay=<hook>:<seconds>"),
        ("delay=allocate:soon", "not a number"),
        ("delay=allocate:-1", ">= 0"),
        ("delay=allocate:inf", ">= 0"),
        ("delay=stop:1", "unknown hook"),
    ],
)
def test_bad_lines_are_reported_and_ignored(line: str, fragment: str) -> None:
    parsed = parse_device_file("mock0", f"numa=3\n{line}\n")
    assert len(parsed.problems) == 1
    assert fragment in parsed.problems[0]
    assert "line 2" in parsed.problems[0]
    assert parsed.numa_nodes == (3,)  # the good line still counts
    assert not parsed.fail
    assert not parsed.delays


def test_natural_key() -> None:
    names = ["mock10", "mock2", "a10b2", "mock1", "a9b10", "a10b10", "a9b2", "mock"]
    assert sorted(names, key=natural_key) == [
        "a9b2",
        "a9b10",
        "a10b2",
        "a10b10",
        "mock",
        "mock1",
        "mock2",
        "mock10",
    ]


@pytest.mark.parametrize(
    ("name", "ok"),
    [("mock0", True), (".calls.jsonl", False), (".x", False), ("a b", False), ("tab\t", False), ("", False)],
)
def test_device_names(name: str, ok: bool) -> None:
    assert is_device_name(name) is ok


def test_settled_files_are_parsed_once_and_changes_are_always_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mock0"
    path.write_text("delay=allocate:1.0\n")
    monkeypatch.setattr(devicefile, "SETTLED_S", 0.0)  # every file counts as settled at once
    first = read_device_file(tmp_path, "mock0")
    assert first is not None and read_device_file(tmp_path, "mock0") is first  # parsed once
    monkeypatch.setattr(devicefile, "SETTLED_S", 1.0)  # the real setting
    path.write_text("delay=allocate:2.0\n")  # same size, just now: read again whatever the file times say
    changed = read_device_file(tmp_path, "mock0")
    assert changed is not None and dict(changed.delays) == {"allocate": 2.0}
    path.write_text("delay=allocate:3.0\n")
    again = read_device_file(tmp_path, "mock0")
    assert again is not None and dict(again.delays) == {"allocate": 3.0}
    old = time.time() - 10
    os.utime(path, (old, old))  # an old modification time, but the change (ctime) is recent: read again
    touched = read_device_file(tmp_path, "mock0")
    assert touched is not None and dict(touched.delays) == {"allocate": 3.0}
