"""The grader's settings (``PBE_`` environment variables), validated when a job starts."""

from services.settings import ServiceSettings


class GraderSettings(ServiceSettings):
    """The grader needs what every service needs: Redis, the suite, the artifact store."""
