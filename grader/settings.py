"""The grader's settings (``PBE_`` environment variables), validated when a job starts."""

from services.sandbox import DEFAULT_SANDBOX_IMAGE
from services.settings import ServiceSettings


class GraderSettings(ServiceSettings):
    """What every service needs (Redis, the suite, the artifact store), and the grading sandbox."""

    SANDBOX_IMAGE: str = DEFAULT_SANDBOX_IMAGE
    """The image whose containers run the checks that open produced files (the sessions' own sandbox image)."""
    GRADING_TIMEOUT_S: float = 120.0
    """How long the checks of one session may run in their sandbox before it is killed (they then fail)."""
