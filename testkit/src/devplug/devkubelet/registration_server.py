"""The kubelet's Registration service on ``kubelet.sock``: checks a RegisterRequest, then hands it on.

The checks and their texts are the kubelet's: a version other than ``v1beta1``
and an invalid extended resource name are refused as plain errors (gRPC
UNKNOWN). Dialing the plugin happens inside the call, in the handler given to
:class:`RegistrationServicer`; if it fails, Register fails with its message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from devplug.errors import KubeletError
from devplug.kube.names import invalid_resource_name_reason

__all__ = [
    "SUPPORTED_VERSIONS",
    "RegistrationServicer",
    "add_registration_servicer",
    "validate_register_request",
]

#: The device plugin API versions the kubelet accepts.
SUPPORTED_VERSIONS = ("v1beta1",)

#: Called with a valid request; dials the plugin and records the registration, or raises KubeletError.
RegisterHandler = Callable[[dp.RegisterRequest], Awaitable[None]]
#: Called with (resource name, refusal text) when a request is refused.
RefusalHandler = Callable[[str, str], None]


def validate_register_request(request: dp.RegisterRequest) -> str | None:
    """The kubelet's refusal text for this request, or None when it passes the checks."""
    if request.version not in SUPPORTED_VERSIONS:
        supported = ", ".join(f'"{v}"' for v in SUPPORTED_VERSIONS)
        return (
            f'requested API version "{request.version}" is not supported by kubelet. '
            f"Supported versions are [{supported}]"
        )
    if invalid_resource_name_reason(request.resource_name) is not None:
        return f'the ResourceName "{request.resource_name}" is invalid'
    return None


class RegistrationServicer:
    """``/v1beta1.Registration/Register``: validate, then let ``on_register`` dial and record it."""

    def __init__(self, on_register: RegisterHandler, on_refused: RefusalHandler) -> None:
        self._on_register = on_register
        self._on_refused = on_refused

    async def Register(
        self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext[dp.RegisterRequest, dp.Empty]
    ) -> dp.Empty:
        """Accept or refuse one registration (refusals abort with UNKNOWN and the kubelet's text)."""
        refusal = validate_register_request(request)
        if refusal is None:
            try:
                await self._on_register(request)
            except KubeletError as exc:
                refusal = str(exc)
        if refusal is not None:
            self._on_refused(str(request.resource_name), refusal)
            await context.abort(grpc.StatusCode.UNKNOWN, refusal)
        return dp.Empty()


def add_registration_servicer(server: grpc.aio.Server, servicer: RegistrationServicer) -> None:
    """Serve ``servicer`` as ``v1beta1.Registration`` on ``server``."""
    dp_grpc.add_RegistrationServicer_to_server(servicer, server)
