"""``python drivers/fpga/demo/fpga_demo.py`` runs on a fresh machine and its checks hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "demo" / "fpga_demo.py"


def test_the_demo_shows_a_region_deprogrammed_after_its_pod() -> None:
    result = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DFL_FPGA_FME_PORT_PR on /dev/dfl-fme.0 -> afu_id 0b1a4c" in result.stdout
    assert "[ok] the blank image was loaded exactly once" in result.stdout
    assert "FAILED" not in result.stdout
