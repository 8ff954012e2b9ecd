"""The gateway's settings (``PBE_`` environment variables), validated when the app is made."""

from typing import Literal

from pydantic import Field, SecretStr

from services.settings import ServiceSettings

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
"""The largest request body the gateway reads."""


class GatewaySettings(ServiceSettings):
    """The gateway's settings; the limits are per API key unless said otherwise."""

    SUITE_NAME: str = "pybench"
    """The name under which the suite at ``SUITE_PATH`` is offered."""
    MAX_BODY_BYTES: int = DEFAULT_MAX_BODY_BYTES
    ADMIN_KEY: SecretStr | None = None
    """The operator's bootstrap admin key (``Authorization: Bearer <it>``); other keys are made with
    ``python -m gateway.keys create``."""
    RATE_LIMIT_PER_MINUTE: int = Field(default=120, ge=1)
    """Requests per key per minute; past it, 429 with Retry-After."""
    MAX_SESSIONS_PER_KEY: int = Field(default=1000, ge=1)
    """Task sessions a key may have queued or running at once; a submission past it gets 429."""
    MAX_QUEUED_SESSIONS: int = Field(default=20000, ge=1)
    """Task sessions waiting in the queue for all keys; a submission past it gets 503."""
    MAX_STREAMS_PER_KEY: int = Field(default=20, ge=1)
    """Event streams (REST and dashboard) one key may have open on one gateway; past it, 429 with Retry-After."""
    MAX_STREAMS: int = Field(default=200, ge=1)
    """Event streams open on one gateway for all keys; past it, 429 with Retry-After."""
    PREFLIGHT: bool = True
    """Check each submitted model endpoint before accepting the evaluation (a submission may opt out)."""
    RECONCILE_INTERVAL_S: float = Field(default=30.0, ge=0)
    """How often the reconciler queues again work a crash dropped (0: never; ``python -m gateway.reconcile``)."""
    IDEMPOTENCY_TTL_S: int = 24 * 3600
    """How long an ``Idempotency-Key`` is remembered."""
    METRICS_ACCESS: Literal["open", "admin", "off"] = "open"
    """Who reads the gateway's ``GET /metrics``: anyone who reaches the port (``open``: counts by route, status and
    state, never an id, a model or a key; for a Prometheus on the same network), an admin key's holder only
    (``admin``), or nobody (``off``: 404)."""
    DASHBOARD_SESSION_TTL_S: int = Field(default=12 * 3600, ge=60, le=30 * 24 * 3600)
    """How long a dashboard sign-in lasts (its session cookie and its record in Redis)."""

    # --- storage limits (services.live.retention) ---
    STORAGE_QUOTA_MB_PER_KEY: int = Field(default=20 * 1024, ge=0)
    """MiB (default 20 GiB) of trajectories and produced files a key's evaluations may take in the artifact store;
    a submission by a key at or over it gets 409 (0: no quota)."""
    RETENTION_DAYS: int = Field(default=90, ge=0)
    """Days after it finished that an evaluation's trajectories and produced files are removed by the reconciler
    (its results and verdicts stay; reads of what went answer 410); 0 keeps them for ever."""
