"""Kernel gateway configuration baked into the sandbox image.

The gateway as shipped leaves Nagle's algorithm on for its kernel websockets, which holds each small
message back for up to ~40 ms (delayed-ACK interplay): a cell round trip then costs tens of milliseconds
instead of a few. Turning on TCP_NODELAY as each kernel websocket opens removes that delay.
"""

from jupyter_server.services.kernels.websocket import KernelWebsocketHandler

_open = KernelWebsocketHandler.open


async def _open_with_nodelay(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    self.set_nodelay(True)
    return await _open(self, *args, **kwargs)  # type: ignore[no-untyped-call]


KernelWebsocketHandler.open = _open_with_nodelay  # type: ignore[method-assign]

c = get_config()  # type: ignore[name-defined]  # noqa: F821
c.KernelGatewayApp.ip = "0.0.0.0"
c.KernelGatewayApp.port = 8888
c.KernelGatewayApp.port_retries = 0
c.KernelGatewayApp.allow_origin = ""
c.JupyterWebsocketPersonality.list_kernels = True
# Kernels started with an explicit environment ({"env": {}} in the start request, as the executor does) get
# PATH and only these variables of the gateway's process: the sandbox's own runtime settings, never the
# gateway's token or anything else. MPLBACKEND is left out on purpose: kernels then use matplotlib's inline
# backend, as in PyBench's notebook harness, so a chart shown with plt.show() comes back as a PNG.
c.KernelGatewayApp.env_process_whitelist = [
    "HOME",
    "LANG",
    "LC_ALL",
    "MPLCONFIGDIR",
    "PYTHONUNBUFFERED",
    "JUPYTER_RUNTIME_DIR",
    "DEBIAN_FRONTEND",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_NO_INPUT",
    "PIP_RETRIES",
    "PIP_DEFAULT_TIMEOUT",
]
