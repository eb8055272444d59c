"""A stand-in for the Kubernetes API server, for drivers' tests: placeholder docstring replaced below."""

from __future__ import annotations

from devplug.testing.apiserver.errors import ApiStatusError, FieldError
from devplug.testing.apiserver.resources import RESOURCES, Resource
from devplug.testing.apiserver.server import ApiServer, Faults
from devplug.testing.apiserver.storage import Event, RequestRecord, Storage, Writer

__all__ = [
    "RESOURCES",
    "ApiServer",
    "ApiStatusError",
    "Event",
    "Faults",
    "FieldError",
    "RequestRecord",
    "Resource",
    "Storage",
    "Writer",
]
