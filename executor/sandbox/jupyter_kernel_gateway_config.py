"""Kernel gateway configuration baked into the sandbox image.

The gateway as shipped leaves Nagle's algorithm on for its kernel websockets, which holds each small
message back for up to ~40 ms (delayed-ACK interplay): a cell round trip then costs tens of milliseconds
instead of a few. Turning on TCP_NODELAY as each kernel websocket opens removes that delay.
"""

from jupyter_server.services.kernels.websocket import KernelWebsocketHandler

_open = KernelWebsocketHandler.open


async def _open_with_nodelay(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    self.set_nodelay(True)
    return await _open(self, *args, **kwargs)


KernelWebsocketHandler.open = _open_with_nodelay

c = get_config()  # type: ignore[name-defined]  # noqa: F821
c.KernelGatewayApp.ip = "0.0.0.0"
c.KernelGatewayApp.port = 8888
c.KernelGatewayApp.port_retries = 0
c.KernelGatewayApp.allow_origin = ""
c.JupyterWebsocketPersonality.list_kernels = True
