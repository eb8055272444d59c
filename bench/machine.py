"""What the run ran on: CPU model, cores, Python, grpcio and protobuf versions."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import grpc
from google.protobuf import __version__ as protobuf_version
from google.protobuf.internal import api_implementation

__all__ = ["machine_info"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """The machine, interpreter and library versions, for ``results.json["machine"]``."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "grpcio": grpc.__version__,
        "protobuf": f"{protobuf_version} ({api_implementation.Type()})",
        "kernel": platform.release(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }
