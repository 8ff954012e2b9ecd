"""The service's own API keys: who may submit evaluations and read them.

A key reads ``pbe_<id>_<secret>``. Redis keeps, per id, the key's name, whether it is an admin key, and the
SHA-256 of its secret (the secret is 32 random bytes, so a fast hash is enough; the plain key is shown once,
when it is made, and never stored). A presented key is found by its id and its secret compared in constant
time. Every evaluation belongs to the key that submitted it; an admin key sees all of them.

The operator's bootstrap admin key (``PBE_ADMIN_KEY``) is not stored: it is compared, in constant time, with
what the gateway was started with, and acts under the id ``admin``.

Redis layout: ``pbe:apikey:<id>`` a hash (``name``, ``admin``, ``sha256``, ``created_at``, ``revoked_at``),
``pbe:apikeys`` the set of ids.
"""

import hashlib
import hmac
import re
import secrets
from datetime import UTC, datetime

from pydantic import BaseModel
from redis import Redis

KEY_PREFIX = "pbe_"
BOOTSTRAP_ID = "admin"
"""The id under which the operator's bootstrap admin key acts."""

_KEY = re.compile(r"^pbe_([0-9a-f]{12})_([A-Za-z0-9_-]{20,100})$")


class ApiKey(BaseModel):
    """A key as listed: never its secret."""

    id: str
    name: str
    admin: bool = False
    created_at: datetime | None = None
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _record_key(key_id: str) -> str:
    return f"pbe:apikey:{key_id}"


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


class ApiKeyStore:
    """Make, check, list and revoke API keys in Redis."""

    def __init__(self, redis: Redis, bootstrap_admin_key: str | None = None) -> None:
        self.redis = redis
        self._bootstrap = bootstrap_admin_key or None

    def create(self, name: str, *, admin: bool = False) -> tuple[ApiKey, str]:
        """Make a key. Returns it and its plain form, which is shown once and stored nowhere.

        Raises:
            ValueError: ``name`` is empty or longer than 100 characters.
        """
        if not name.strip() or len(name) > 100:
            raise ValueError("a key needs a name of 1 to 100 characters (who or what uses it)")
        key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        key = ApiKey(id=key_id, name=name.strip(), admin=admin, created_at=datetime.now(UTC))
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(
            _record_key(key_id),
            mapping={
                "name": key.name,
                "admin": "1" if admin else "0",
                "sha256": _digest(secret),
                "created_at": key.created_at.isoformat() if key.created_at else "",
            },
        )
        pipe.sadd("pbe:apikeys", key_id)
        pipe.execute()
        return key, f"{KEY_PREFIX}{key_id}_{secret}"

    def authenticate(self, presented: str) -> ApiKey | None:
        """The active key ``presented`` is, or None (unknown, malformed, wrong secret or revoked)."""
        if self._bootstrap is not None and hmac.compare_digest(presented.encode(), self._bootstrap.encode()):
            return ApiKey(id=BOOTSTRAP_ID, name="bootstrap admin (PBE_ADMIN_KEY)", admin=True)
        match = _KEY.match(presented)
        if match is None:
            return None
        key_id, secret = match.groups()
        record = self.redis.hgetall(_record_key(key_id))
        if not record:
            hmac.compare_digest(_digest(secret), _digest(""))  # the same work for an unknown id
            return None
        fields = {_text(k): _text(v) for k, v in record.items()}
        if not hmac.compare_digest(_digest(secret), fields.get("sha256", "")) or fields.get("revoked_at"):
            return None
        return self._key(key_id, fields)

    def get(self, key_id: str) -> ApiKey | None:
        record = self.redis.hgetall(_record_key(key_id))
        return self._key(key_id, {_text(k): _text(v) for k, v in record.items()}) if record else None

    def list(self) -> list[ApiKey]:
        """Every key made, revoked ones included, oldest first."""
        keys = [self.get(_text(key_id)) for key_id in self.redis.smembers("pbe:apikeys")]
        found = [key for key in keys if key is not None]
        return sorted(found, key=lambda key: key.created_at or datetime.min.replace(tzinfo=UTC))

    def revoke(self, key_id: str) -> bool:
        """Revoke a key (it stops working at once; its evaluations stay). Returns whether it existed."""
        if not self.redis.exists(_record_key(key_id)):
            return False
        self.redis.hsetnx(_record_key(key_id), "revoked_at", datetime.now(UTC).isoformat())
        return True

    @staticmethod
    def _key(key_id: str, fields: dict[str, str]) -> ApiKey:
        return ApiKey(
            id=key_id,
            name=fields.get("name", ""),
            admin=fields.get("admin") == "1",
            created_at=datetime.fromisoformat(fields["created_at"]) if fields.get("created_at") else None,
            revoked_at=datetime.fromisoformat(fields["revoked_at"]) if fields.get("revoked_at") else None,
        )
