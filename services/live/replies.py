"""The reply cache of an evaluation: the model's replies kept by what was asked, so that a session run again
after an infrastructure failure pays once for the turns it already had.

A reply is kept under the hash of everything that decides it (``request_key``): the endpoint, the model, the
messages, the sampling parameters (the epoch's seed among them), the tools offered and the epoch. A retried
session that asks the same thing again (its opening messages, then each replayed reply and its cell's output
from the fresh sandbox) gets the kept reply without a model call; the first request that differs (a cell whose
output changed, or a turn the failed attempt never reached) goes to the model, and so does everything after it.

It is opt-in per evaluation (``EvaluationCreate.reply_cache``): only an endpoint that answers the same request
the same way (greedy decoding, or a seed it honours) may be replayed, and only the user knows that.

Keys (``pbe:``)::

    pbe:evaluation:<id>:replies    hash request key -> the reply as JSON; expires REPLY_TTL_S after its last write

Bounds: a reply over ``MAX_CACHED_REPLY_BYTES`` is not kept (its turn is paid again); an evaluation keeps at most
``MAX_CACHED_REPLIES``; an entry that does not read as a reply is a miss, never an error.
"""

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from redis import Redis
from redis.exceptions import RedisError

from services.endpoint.client import Completion
from services.state import evaluation_key

log = logging.getLogger(__name__)

REPLY_TTL_S = 7 * 86_400
"""How long an evaluation's kept replies live after the last one was written (a retry comes within minutes; a
retry asked for by hand, within days)."""

MAX_CACHED_REPLY_BYTES = 1 << 20
"""A reply larger than this (its JSON) is not kept: its turn is paid again on a retry."""

MAX_CACHED_REPLIES = 20_000
"""The most replies one evaluation keeps (143 tasks of up to 30 turns, with room for tools' fallbacks)."""


def _as_dict(message: Mapping[str, Any] | BaseModel) -> Any:
    return message.model_dump() if isinstance(message, BaseModel) else dict(message)


def request_key(
    base_url: str,
    model: str,
    messages: Sequence[Mapping[str, Any] | BaseModel],
    sampling: Mapping[str, Any],
    tools: list[dict[str, Any]] | None,
    epoch: int,
) -> str:
    """The cache key of one chat-completion request: a sha256 over its canonical JSON. Raises nothing for
    JSON-shaped input (``TypeError`` for a value JSON cannot hold)."""
    identity = {
        "endpoint": base_url,
        "model": model,
        "messages": [_as_dict(m) for m in messages],
        "sampling": dict(sampling),
        "tools": tools or [],
        "epoch": epoch,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _encode(completion: Completion) -> str:
    return json.dumps(
        {
            "text": completion.text,
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "latency_s": completion.latency_s,
            "finish_reason": completion.finish_reason,
            "tool_calls": completion.tool_calls,
        }
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _decode(raw: bytes) -> Completion | None:
    """The kept reply, or None when ``raw`` does not read as one."""
    try:
        data = json.loads(raw)
        text, calls = data["text"], data["tool_calls"]
        if not isinstance(text, str) or not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            return None
        latency = data.get("latency_s")
        finish = data.get("finish_reason")
        return Completion(
            text=text,
            prompt_tokens=_count(data.get("prompt_tokens")),
            completion_tokens=_count(data.get("completion_tokens")),
            latency_s=float(latency) if isinstance(latency, int | float) else 0.0,
            finish_reason=finish if isinstance(finish, str) else None,
            tool_calls=calls,
            requests=0,
            replayed=True,
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


class ReplyCache:
    """The kept replies of one evaluation. Redis being unreachable makes every lookup a miss and every write a
    no-op (logged): the session then pays for its calls, as without a cache. Raises nothing."""

    def __init__(self, redis: Redis, evaluation_id: str) -> None:
        self.redis = redis
        self.key = evaluation_key(evaluation_id, "replies")

    def get(self, key: str) -> Completion | None:
        """The reply kept under ``key`` (``replayed`` set, no request counted), or None."""
        try:
            raw = self.redis.hget(self.key, key)
        except RedisError as exc:
            log.warning("the reply cache cannot be read (%s): the model is asked", exc)
            return None
        return _decode(raw) if isinstance(raw, bytes) else None

    def put(self, key: str, completion: Completion) -> bool:
        """Keep ``completion`` under ``key``; returns whether it was kept (not when it is over
        ``MAX_CACHED_REPLY_BYTES``, the evaluation already keeps ``MAX_CACHED_REPLIES``, or Redis failed)."""
        encoded = _encode(completion)
        if len(encoded.encode()) > MAX_CACHED_REPLY_BYTES:
            return False
        try:
            if self.redis.hlen(self.key) >= MAX_CACHED_REPLIES:
                return False
            pipe = self.redis.pipeline()
            pipe.hset(self.key, key, encoded)
            pipe.expire(self.key, REPLY_TTL_S)
            pipe.execute()
        except RedisError as exc:
            log.warning("the reply cache cannot be written (%s): a retry will ask the model again", exc)
            return False
        return True

    def __len__(self) -> int:
        try:
            return int(self.redis.hlen(self.key))
        except RedisError:
            return 0
