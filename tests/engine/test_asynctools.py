"""``in_daemon_thread``: a blocking call that may never return holds up neither its caller nor the exit (issue 24).

The reload reads the config in one; the case that matters is a call stuck in
the kernel (here: opening a FIFO nobody writes, which blocks in ``open``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devplug.engine.asynctools import in_daemon_thread


def test_the_result_and_the_error_of_the_call_come_back() -> None:
    assert asyncio.run(in_daemon_thread("t", lambda: 42, timeout=10.0)) == 42

    def fail() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        asyncio.run(in_daemon_thread("t", fail, timeout=10.0))


def test_a_call_stuck_in_open_times_out_and_the_process_still_exits(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = textwrap.dedent(
        f"""
        import asyncio
        from devplug.engine.asynctools import in_daemon_thread

        async def main():
            try:
                await in_daemon_thread("stuck", lambda: open({str(fifo)!r}).read(), timeout=0.2)
            except TimeoutError:
                print("timed out")

        asyncio.run(main())
        print("asyncio.run returned")
        """
    )
    # With run_in_executor, asyncio.run would wait for the stuck thread at its end: the child would never exit.
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["timed out", "asyncio.run returned"]
