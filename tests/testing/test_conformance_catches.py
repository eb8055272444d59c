"""DriverConformance fails a driver that breaks the contract (here: a release recorded twice)."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

BROKEN_DRIVER = '''
from devplug import hookimpl
from devplug_mock import MockDriver


class ReleasesTwice(MockDriver):
    """The mock, but every deallocate is done (and recorded) twice."""

    @hookimpl
    def deallocate(self, device_ids, retry):
        super().deallocate(device_ids, retry)
        super().deallocate(device_ids, retry)
'''

SUITE = """
from pathlib import Path

from devplug.testing.conformance import DriverConformance


class TestReleasesTwice(DriverConformance):
    driver = "releases-twice"
    test_drivers = {"releases-twice": "broken_driver:ReleasesTwice"}
    python_path = (Path(__file__).parent,)

    def options(self, folder):
        return {"directory": str(folder), "count": 1}
"""


def test_a_driver_releasing_twice_fails_the_release_checks(
    tmp_path: Path, run_pytest: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    (tmp_path / "broken_driver.py").write_text(textwrap.dedent(BROKEN_DRIVER))
    (tmp_path / "test_broken.py").write_text(textwrap.dedent(SUITE))
    done = run_pytest(tmp_path, timeout=300)
    out = done.stdout
    assert done.returncode == 1, out[-4000:]
    failed = sorted(line.split("::")[-1].split(" ")[0] for line in out.splitlines() if line.startswith("FAILED"))
    assert failed == ["test_releases_exactly_once[kep]", "test_releases_exactly_once[stock]"], out[-4000:]
