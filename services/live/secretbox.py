"""Sealing the API keys held in Redis, so they never reach its append-only file or snapshot in plain text.

A key is sealed with AES-256-GCM under the service's secrets key (``PBE_SECRETS_KEY``: 32 random bytes in
URL-safe base64, which ``make env`` and ``k8s/secrets.sh`` make), with a fresh 96-bit nonce per seal and the
Redis name it is stored under as associated data: a sealed value copied to another evaluation's name does not
open. docs/protocol.md says why sealing, and not a store that does not persist.
"""

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from services.errors import ConfigurationError

KEY_BYTES = 32
"""AES-256."""

NONCE_BYTES = 12
"""GCM's nonce; random per seal (a key seals a few values per evaluation, far below the birthday bound)."""


class SecretsKeyMissingError(ConfigurationError):
    """The service holds no secrets key, so it cannot keep an API key (the gateway answers 503)."""


def new_key() -> str:
    """A fresh secrets key as ``PBE_SECRETS_KEY`` holds it."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode()


class SecretBox:
    """Seals and opens short secrets under one key."""

    def __init__(self, key: bytes) -> None:
        """Raises:
        ConfigurationError: ``key`` is not ``KEY_BYTES`` long."""
        if len(key) != KEY_BYTES:
            raise ConfigurationError(f"the secrets key must be {KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)

    @classmethod
    def from_setting(cls, value: str) -> "SecretBox":
        """The box of a ``PBE_SECRETS_KEY`` value.

        Raises:
            ConfigurationError: the value is not 32 bytes in URL-safe base64 (say how to make one).
        """
        try:
            key = base64.b64decode(value.strip().encode(), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise ConfigurationError(
                f"PBE_SECRETS_KEY must be {KEY_BYTES} random bytes in URL-safe base64; make one with "
                "python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())' "
                "(make env writes one into .env)"
            )
        return cls(key)

    def seal(self, secret: str, name: str) -> bytes:
        """``secret`` sealed for storing under ``name`` (the nonce, then the ciphertext and its tag)."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, secret.encode(), name.encode())

    def open(self, sealed: bytes, name: str) -> str | None:
        """The secret sealed under ``name``; None when it does not open (another key sealed it, it was stored
        under another name, or it was altered): the caller treats it as lost. Raises nothing."""
        if len(sealed) <= NONCE_BYTES:
            return None
        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], name.encode()).decode()
        except (InvalidTag, UnicodeDecodeError):
            return None
