"""``Idempotency-Key``: a repeated submission returns the evaluation the first one made.

The key is remembered per API key, with a hash of the body it came with: the same key with another body is
refused (409), as is a key whose first submission is still being made.
"""

import hashlib
import uuid
from dataclasses import dataclass

from pydantic import BaseModel
from redis import Redis

from gateway.problems import Problem

_PENDING = "pending:"


@dataclass(frozen=True)
class Claim:
    evaluation_id: str
    """The id the new evaluation gets."""
    existing: str | None = None
    """The evaluation an earlier submission with the same key made (nothing new is made then)."""
    redis_key: str | None = None


def _fingerprint(body: BaseModel) -> str:
    # Secrets are part of what was asked for, so they count; only their hash is kept.
    raw = (
        body.model_dump_json(exclude={"api_key", "judge_api_key"})
        + "|"
        + "|".join(
            getattr(body, name).get_secret_value() if getattr(body, name, None) else ""
            for name in ("api_key", "judge_api_key")
        )
    )
    return hashlib.sha256(raw.encode()).hexdigest()


def claim(redis: Redis, owner: str, key: str | None, body: BaseModel, ttl_s: int) -> Claim:
    """Claim an evaluation id for this submission.

    Raises:
        Problem: 409 for a key reused with another body, or while the first submission is being made.
    """
    evaluation_id = uuid.uuid4().hex[:20]
    if key is None:
        return Claim(evaluation_id)
    redis_key = f"pbe:idempotency:{owner}:{hashlib.sha256(key.encode()).hexdigest()}"
    fingerprint = _fingerprint(body)
    if redis.set(redis_key, f"{_PENDING}{evaluation_id}|{fingerprint}", nx=True, ex=ttl_s):
        return Claim(evaluation_id, redis_key=redis_key)
    raw = redis.get(redis_key)
    value = raw.decode() if isinstance(raw, bytes) else (raw or "")
    stored_id, _, stored_fingerprint = value.partition("|")
    if stored_fingerprint != fingerprint:
        raise Problem(
            409,
            "Idempotency-Key reused",
            "this Idempotency-Key came with another body; use a new key for a different submission",
        )
    if stored_id.startswith(_PENDING):
        raise Problem(
            409,
            "Submission in progress",
            "the first submission with this Idempotency-Key is still being made; retry in a second",
        )
    return Claim(stored_id, existing=stored_id)


def confirm(redis: Redis, claim: Claim, ttl_s: int) -> None:
    """Record that the claimed evaluation exists (later submissions with the key return it)."""
    if claim.redis_key is not None:
        raw = redis.get(claim.redis_key)
        value = raw.decode() if isinstance(raw, bytes) else (raw or "")
        redis.set(claim.redis_key, value.removeprefix(_PENDING), ex=ttl_s)


def release(redis: Redis, claim: Claim) -> None:
    """Forget a claim whose submission failed (the key may be used again)."""
    if claim.redis_key is not None:
        redis.delete(claim.redis_key)
