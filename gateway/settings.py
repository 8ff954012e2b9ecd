"""The gateway's settings (``PBE_`` environment variables), validated when the app is made."""

from services.settings import ServiceSettings

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
"""The largest request body the gateway reads."""


class GatewaySettings(ServiceSettings):
    SUITE_NAME: str = "pybench"
    """The name under which the suite at ``SUITE_PATH`` is offered."""
    MAX_BODY_BYTES: int = DEFAULT_MAX_BODY_BYTES
