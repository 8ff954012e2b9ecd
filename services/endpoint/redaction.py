"""Cutting an API key out of text an endpoint sent back (some servers echo the request, headers included)."""

REDACTED = "[REDACTED]"
"""What stands where the key was."""


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``REDACTED`` (``text`` itself without a secret)."""
    return text.replace(secret, REDACTED) if secret else text
