"""The settings base every service subclasses.

Settings are read from ``PBE_``-prefixed environment variables when a settings object is made (at start-up
or in a test), never at import time.
"""

import functools
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from services.errors import ConfigurationError
from services.live.secretbox import SecretBox

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
"""Where Redis listens when nothing else is said (a local development server)."""

DEFAULT_SUITE_PATH = Path("../shared/pybench")
"""The PyBench suite in this repository's development setup (a sibling folder, never copied in)."""

DEFAULT_ARTIFACT_ROOT = Path("var/artifacts")
"""Where trajectories, produced files and verdicts are stored when nothing else is said."""


DEFAULT_REDIS_RETRIES = 20
"""How often a Redis command is tried again after a connection error or timeout, waiting 0.5 s, then twice as long
each time up to 4 s: about 70 s in all (``redis_retry_window_s``), so a restart of Redis is ridden out instead of
failing the session or the grading that asked."""


def _redis_backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=4.0, base=0.25)


def redis_retry() -> Retry:
    """The retry policy of every service's Redis connection (``DEFAULT_REDIS_RETRIES``)."""
    return Retry(_redis_backoff(), DEFAULT_REDIS_RETRIES)


def redis_retry_window_s() -> float:
    """How long a Redis command that finds Redis away keeps trying before it raises: ``redis_retry``'s waits."""
    backoff = _redis_backoff()
    return sum(backoff.compute(failures) for failures in range(1, DEFAULT_REDIS_RETRIES + 1))


class ServiceSettings(BaseSettings):
    """What every service needs: Redis, the suite, the artifact store."""

    model_config = SettingsConfigDict(env_prefix="PBE_", extra="ignore")

    REDIS_URL: str = DEFAULT_REDIS_URL
    SUITE_PATH: Path = DEFAULT_SUITE_PATH
    ARTIFACT_ROOT: Path = DEFAULT_ARTIFACT_ROOT
    METRICS_PORT: int = Field(default=0, ge=0, le=65535)
    """Where a worker serves its Prometheus series (``/metrics``); 0 serves none (the gateway serves its own on
    its port whatever this says)."""
    METRICS_HOST: str = "route-to:redis"
    """Where a worker's metrics listen: an IP address, or ``route-to:redis`` (the default), this host's address on
    its route to Redis: the services' network, never the one an executor shares with its sandboxes."""
    EGRESS_ALLOWLIST: str = ""
    """Hosts (``name``, ``*.suffix``) and CIDRs that submitted model and judge endpoints may reach although
    they are internal (e.g. ``replay`` in compose, an in-cluster vLLM service); everything else internal is
    refused."""
    SECRETS_KEY: SecretStr = SecretStr("")
    """The key that seals the API keys held in Redis (32 random bytes in URL-safe base64; ``make env`` writes one
    into .env). The gateway, executors and graders need the same one; without it, keyed submissions get 503."""

    @field_validator("REDIS_URL")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("PBE_REDIS_URL must start with redis://, rediss:// or unix://")
        return value

    @field_validator("EGRESS_ALLOWLIST")
    @classmethod
    def _allowlist(cls, value: str) -> str:
        from services.endpoint.netguard import EgressPolicy

        EgressPolicy.parse(value)  # raises ValueError naming the bad entry
        return value

    def redis(self) -> Redis:
        """A client of ``REDIS_URL`` that rides out a Redis restart (``redis_retry``); commands raise
        ``redis.exceptions.ConnectionError`` only when Redis stays away longer."""
        return Redis.from_url(self.REDIS_URL, retry=redis_retry())

    def secret_box(self) -> SecretBox | None:
        """The box that seals API keys under ``SECRETS_KEY``; None when it is not set.

        Raises:
            ConfigurationError: ``SECRETS_KEY`` is set but not a key (say how to make one).
        """
        value = self.SECRETS_KEY.get_secret_value()
        return _box(value) if value else None

    def require_suite(self) -> Path:
        """Return the suite path.

        Raises:
            ConfigurationError: the path holds no suite (no ``data/meta/task.json``).
        """
        path = self.SUITE_PATH
        if not (path / "data" / "meta" / "task.json").is_file():
            raise ConfigurationError(
                f"no suite at {path}: set PBE_SUITE_PATH to a folder in PyBench's layout "
                "(data/meta/task.json, data/, prompts/)"
            )
        return path


@functools.cache
def _box(value: str) -> SecretBox:
    """One box per secrets key (a settings object is made per request in places)."""
    return SecretBox.from_setting(value)
