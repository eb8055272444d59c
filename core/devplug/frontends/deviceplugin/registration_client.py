"""The engine's client of the kubelet's Registration service (the dev kubelet serves it in
:mod:`devplug.devkubelet.registration_server`)."""

from __future__ import annotations

from pathlib import Path

import grpc
import grpc.aio

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

__all__ = ["API_VERSION", "REGISTER_METHOD", "register"]

API_VERSION = "v1beta1"
REGISTER_METHOD = "/v1beta1.Registration/Register"


async def register(kubelet_socket: Path, request: dp.RegisterRequest, timeout: float = 15.0) -> None:
    """Call ``Registration/Register`` on ``kubelet_socket`` once; raises ``grpc.aio.AioRpcError`` on failure.

    The kubelet dials the plugin back inside this call (up to 10 s), so the
    plugin's server must already be serving; ``timeout`` covers that.
    """
    # A channel of its own subchannel pool: gRPC otherwise shares subchannels process-wide and
    # replays a connect that failed while kubelet.sock was missing to the next attempt, with backoff.
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}", options=options) as channel:
        call = channel.unary_unary(
            REGISTER_METHOD,
            request_serializer=dp.RegisterRequest.SerializeToString,
            response_deserializer=dp.Empty.FromString,
        )
        await call(request, timeout=timeout)
