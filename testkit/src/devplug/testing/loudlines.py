"""Lines a test run says loudly at its end (a suite that did not run, one that ran and how), from every process.

A test module or conftest registers a *source* with :func:`loud_source`: a function called once at the end of the
session that returns the lines to say, each a :data:`LoudLine` (text and colour). devplug's pytest plugin prints
them after the run's summary.

Under pytest-xdist (``make test TEST_WORKERS=3`` runs the tests in three worker processes) a worker has no terminal
of its own: at the end of its session its sources' lines go to the controller in ``config.workeroutput`` (the
channel pytest-xdist gives a worker's results, sent by its ``pytest_sessionfinish`` wrapper after the plain hooks
ran), the controller gathers them as each worker goes down (``pytest_testnodedown``) and prints them with its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

__all__ = ["Colour", "LoudLine", "loud_source", "write_lines"]

Colour = Literal["green", "red"]
#: One line to say: its text and its colour (red lines are bold: something did not run or went wrong).
LoudLine = tuple[str, Colour]

#: The key of a worker's lines in ``config.workeroutput``.
_WORKER_KEY = "devplug_loud_lines"
_SOURCES: list[Callable[[], list[LoudLine]]] = []
_FROM_WORKERS: list[LoudLine] = []


def loud_source(source: Callable[[], list[LoudLine]]) -> Callable[[], list[LoudLine]]:
    """Register ``source`` (usable as a decorator): called once at the end of the session in the process that ran
    the tests, it returns the lines to say."""
    _SOURCES.append(source)
    return source


def _own_lines() -> list[LoudLine]:
    return [line for source in _SOURCES for line in source()]


def send_from_worker(config: Any) -> None:
    """At the end of a pytest-xdist worker's session: put its lines where the controller receives them (nothing to do
    in a run without workers)."""
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_WORKER_KEY] = [list(line) for line in _own_lines()]


def receive_from_worker(node: Any) -> None:
    """On the controller, as a worker goes down: keep the lines it sent (none when it crashed before sending)."""
    for text, colour in getattr(node, "workeroutput", {}).get(_WORKER_KEY, []):
        _FROM_WORKERS.append((str(text), "red" if colour == "red" else "green"))


def write(terminalreporter: Any) -> None:
    """Print this process's lines and the workers', each line once (several workers may warn alike), for
    ``pytest_terminal_summary``."""
    write_lines(terminalreporter, list(dict.fromkeys([*_own_lines(), *_FROM_WORKERS])))


def write_lines(terminalreporter: Any, lines: list[LoudLine]) -> None:
    """Print ``lines`` in their colours, the red ones bold."""
    for text, colour in lines:
        terminalreporter.write_line(text, green=colour == "green", red=colour == "red", bold=colour == "red")
