"""Dashboard sign-in sessions, held server-side in Redis.

A browser signs in once with an API key of this service; the key is checked with the same ``ApiKeyStore`` as the
REST API and then forgotten. The browser gets a random session token in an HttpOnly cookie; Redis maps the token's
SHA-256 (never the token, never the key) to the key's id and the session's CSRF token::

    pbe:dashboard:session:<sha256 of the token>   hash: key_id, admin_fingerprint, csrf   (expires)

Every request looks the key up again by its id, so a revoked key loses its sessions at once. The operator's
bootstrap admin key is not stored anywhere; its sessions carry a fingerprint of it and end when it changes.
"""

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from redis import Redis

from services.live.apikeys import BOOTSTRAP_ID, ApiKey, ApiKeyStore

SESSION_PREFIX = "pbe:dashboard:session:"
"""Redis key prefix of the dashboard's sessions."""


@dataclass(frozen=True)
class Session:
    """A signed-in browser: whose key it acts as, and the token its forms must send back."""

    key: ApiKey
    csrf: str
    token_hash: str


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _fingerprint(admin_key: str | None) -> str:
    return hashlib.sha256(f"pbe-dashboard:{admin_key}".encode()).hexdigest() if admin_key else ""


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


class SessionStore:
    """Open, resolve and close dashboard sessions; ``admin_key`` is the gateway's bootstrap admin key."""

    def __init__(self, redis: Redis, admin_key: str | None, ttl_s: int) -> None:
        self.redis = redis
        self.keys = ApiKeyStore(redis, admin_key)
        self._admin_key = admin_key
        self.ttl_s = ttl_s

    def open(self, presented_key: str) -> tuple[str, Session] | None:
        """Sign in with an API key. Returns the new session's cookie token and the session, or None when the key
        is unknown, malformed or revoked. Raises nothing of its own (Redis errors pass through)."""
        key = self.keys.authenticate(presented_key.strip())
        if key is None:
            return None
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        token_hash = _hash(token)
        record = {
            "key_id": key.id,
            "admin_fingerprint": _fingerprint(self._admin_key) if key.id == BOOTSTRAP_ID else "",
            "csrf": csrf,
        }
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(SESSION_PREFIX + token_hash, mapping=record)  # type: ignore[arg-type]
        pipe.expire(SESSION_PREFIX + token_hash, self.ttl_s)
        pipe.execute()
        return token, Session(key=key, csrf=csrf, token_hash=token_hash)

    def resolve(self, token: str | None) -> Session | None:
        """The session a cookie token opens, or None (no token, expired or closed, the key revoked, or the admin
        key changed since). Raises nothing of its own."""
        if not token or len(token) > 200:
            return None
        token_hash = _hash(token)
        raw = self.redis.hgetall(SESSION_PREFIX + token_hash)
        if not raw:
            return None
        record = {_text(k): _text(v) for k, v in raw.items()}
        key_id = record.get("key_id", "")
        if key_id == BOOTSTRAP_ID:
            expected = _fingerprint(self._admin_key)
            if not expected or not hmac.compare_digest(expected, record.get("admin_fingerprint", "")):
                return None
            key: ApiKey | None = ApiKey(id=BOOTSTRAP_ID, name="bootstrap admin (PBE_ADMIN_KEY)", admin=True)
        else:
            key = self.keys.get(key_id)
        if key is None or not key.active:
            return None
        return Session(key=key, csrf=record.get("csrf", ""), token_hash=token_hash)

    def close(self, session: Session) -> None:
        """Sign out: the session's token stops working."""
        self.redis.delete(SESSION_PREFIX + session.token_hash)
