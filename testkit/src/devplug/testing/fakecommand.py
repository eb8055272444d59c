"""A fake external command for drivers that run one (a vendor tool, an erase utility): a real executable that
records each call and can be told to fail, hang, be slow, flood its output or leave a child behind.

The driver under test runs it as it would run the real tool (through
:func:`devplug.kit.run_command`, from a daemon under test or from the test's own
process): it is a Python script in a folder, and everything about it lives in
files there, so any process sees the same behaviour and the same record::

    tool = FakeCommand(tmp_path / "tool", name="nvme")
    options = {"erase_command": [str(tool.path), "format", "{device}", "--ses=1"]}
    tool.behave(format={"exit": 5, "stderr": "NVMe status: ACCESS_DENIED"})     # every format fails
    tool.behave({"format:/dev/nvme1": {"hang": True}})                          # only nvme1's hangs...
    tool.release("format")                                                      # ...until released
    assert [c["argv"] for c in tool.calls("format", "done")] == [["format", "/dev/nvme0", "--ses=1"]]

Its first argument is the *verb* (``format``); a behaviour is looked up under
``"<verb>:<argument>"`` for each later argument (the first one set wins), then
under ``"<verb>"``. A behaviour is an object of:

* ``"exit": n`` (with ``"stderr": text``) -- print ``<verb>: working on <its first --key's value, or its
  arguments>`` on stdout, the text on stderr, exit ``n``;
* ``"hang": true`` -- wait until :meth:`FakeCommand.release` (then go on), or until its parent dies (then exit
  137, recording ``orphaned``): a tool stuck in the hardware, which only a timeout's kill ends;
* ``"sleep": seconds`` -- take that long, then go on (a slow but working tool);
* ``"child": true`` -- first start a child that inherits stdout and stderr and runs until
  :meth:`FakeCommand.release_child`: a vendor's wrapper script whose helper outlives it;
* ``"output": n`` -- print ``n`` bytes on stdout and on stderr (one line each) before going on;
* ``"stdout": text`` -- print it on success.

Every call appends ``{"verb", "argv", "args", "event", "pid"}`` to
``calls.jsonl`` beside it (``argv``: its arguments; ``args``: the
``--key value`` pairs among them; events: ``start``, ``child`` with the pid of
the child it started, ``hanging``, ``orphaned``, ``failed``, ``done``).
``effect`` is Python run on success before ``done`` (with ``verb``, ``argv``,
``args``, ``here`` -- the folder -- and ``fail(message, code=1)`` in scope):
how a suite models what the real tool does to the device (an FPGA tool writes
the region's content; an erase tool blanks the drive).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["FakeCommand"]

_SCRIPT = r"""
import json, os, sys, time
from pathlib import Path

here = Path(__file__).resolve().parent
argv = sys.argv[1:]
verb = argv[0] if argv else ""
args = dict(zip(argv[1::2], argv[2::2])) if all(a.startswith("--") for a in argv[1::2]) else {}
args = {k: v for k, v in args.items() if k.startswith("--")}
parent = os.getppid()

def log(event):
    entry = {"verb": verb, "argv": argv, "args": args, "event": event, "pid": os.getpid()}
    with open(here / "calls.jsonl", "a") as handle:
        handle.write(json.dumps(entry) + "\n")

def fail(message, code=1):
    sys.stderr.write(message + "\n")
    log("failed")
    sys.exit(code)

log("start")
try:
    table = json.loads((here / "behaviour.json").read_text())
except FileNotFoundError:
    table = {}
keys = [f"{verb}:{a}" for a in argv[1:]] + [verb]
behaviour = next((table[k] for k in keys if k in table), {})
if behaviour.get("child"):
    import subprocess
    wait = f"import os, time\nwhile not os.path.exists({str(here / 'release-child')!r}): time.sleep(0.01)"
    child = subprocess.Popen([sys.executable, "-c", wait])
    with open(here / "calls.jsonl", "a") as handle:  # the child's entry: its pid, for a test to watch
        handle.write(json.dumps({"verb": verb, "argv": argv, "args": args, "event": "child", "pid": child.pid}) + "\n")
if behaviour.get("output"):
    sys.stdout.write("o" * behaviour["output"] + "\n")
    sys.stderr.write("e" * behaviour["output"] + "\n")
    sys.stdout.flush()
if behaviour.get("hang"):
    log("hanging")
    while not (here / f"release-{verb}").exists():
        if os.getppid() != parent:
            log("orphaned")
            sys.exit(137)
        time.sleep(0.01)
if behaviour.get("sleep"):
    time.sleep(float(behaviour["sleep"]))
if "exit" in behaviour:
    print(f"{verb}: working on {next(iter(args.values()), ' '.join(argv[1:]))}")
    fail(behaviour.get("stderr", "failed"), behaviour["exit"])
"""

_DONE = r"""
if behaviour.get("stdout"):
    print(behaviour["stdout"])
log("done")
"""


class FakeCommand:
    """The fake command ``name`` in ``folder`` (created): its :attr:`path`, its behaviour and its record."""

    def __init__(self, folder: Path, name: str = "fake-tool", *, effect: str = "") -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / name
        body = _SCRIPT + (textwrap.dedent(effect) if effect else "") + _DONE
        self.path.write_text(f"#!{sys.executable}\n{body}")
        self.path.chmod(0o755)

    def argv(self, *args: str) -> list[str]:
        """The command line running it with ``args`` (its path first)."""
        return [str(self.path), *args]

    def behave(self, verbs: Mapping[str, Mapping[str, Any]] | None = None, **by_verb: Mapping[str, Any]) -> None:
        """Set what each verb (or ``"verb:argument"``) does, replacing what was set; others just work."""
        (self.folder / "behaviour.json").write_text(json.dumps({**(verbs or {}), **by_verb}))

    def release(self, verb: str) -> None:
        """Let a hanging ``verb`` go on (and any later one: the release stays)."""
        (self.folder / f"release-{verb}").write_text("")

    def release_child(self) -> None:
        """Let the children of ``"child"`` calls end."""
        (self.folder / "release-child").write_text("")

    def calls(
        self, verb: str | None = None, event: str | None = None, args: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The recorded calls, oldest first: those of ``verb``, of ``event``, whose ``--key value`` pairs include
        ``args`` (each filter when given)."""
        try:
            lines = (self.folder / "calls.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        found = [json.loads(line) for line in lines if line.strip()]
        wanted = dict(args or {})
        return [
            c
            for c in found
            if (verb is None or c["verb"] == verb)
            and (event is None or c["event"] == event)
            and wanted.items() <= c["args"].items()
        ]

    def running(self) -> list[int]:
        """The pids of calls that started and neither ended nor were recorded ending (still alive now)."""
        ended = {c["pid"] for c in self.calls() if c["event"] in ("done", "failed", "orphaned")}
        return [
            c["pid"] for c in self.calls(event="start") if c["pid"] not in ended and os.path.exists(f"/proc/{c['pid']}")
        ]
