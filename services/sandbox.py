"""The sandbox handle: enough to re-attach to a running sandbox from another process, or to clean it up."""

from datetime import UTC, datetime

from pydantic import BaseModel, Field

SANDBOX_LABEL_PREFIX = "pybench-eval"
"""Prefix of the labels every sandbox container carries (``pybench-eval.evaluation`` ...)."""

SANDBOX_NAME_PREFIX = "pbe-sbx-"
"""Every sandbox container's name starts with this, so one pattern finds them all."""


class SandboxHandle(BaseModel):
    backend: str
    sandbox_id: str
    name: str
    url: str
    """The kernel gateway's base URL as the executor reaches it, e.g. ``http://172.18.0.5:8888``."""
    token: str = Field(repr=False)
    """The kernel gateway's auth token: the sandbox's own, never a user secret; kept out of reprs and logs."""
    image: str
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    labels: dict[str, str] = Field(default_factory=dict)


def docker_created_epoch(stamp: str) -> float:
    """Seconds since the epoch of a Docker timestamp (``2026-11-23T03:34:00.123456789Z``); 0 if unreadable.

    Both the executor's sandboxes and the grader's grading sandboxes are reaped by age with it.
    """
    try:
        return datetime.fromisoformat(stamp[:19]).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0
