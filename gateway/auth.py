"""Who is calling: the API key of each request, and the per-key request rate.

Every ``/v1`` route needs ``Authorization: Bearer <key>``; an admin key sees every evaluation, another key only
its own (another key's evaluation answers 404, as one that does not exist). Past the key's rate, requests get
429 with ``Retry-After``.
"""

import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis

from gateway.deps import RedisDep, SettingsDep
from gateway.problems import Problem
from services.live.apikeys import ApiKey, ApiKeyStore

_bearer = HTTPBearer(auto_error=False, description="An API key of this service: `pbe_<id>_<secret>`.")

_MAKE_A_KEY = "an operator makes keys with `python -m gateway.keys create --name <who>`"


def key_store(redis: RedisDep, settings: SettingsDep) -> ApiKeyStore:
    admin = settings.ADMIN_KEY.get_secret_value() if settings.ADMIN_KEY else None
    return ApiKeyStore(redis, admin)


def get_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    keys: Annotated[ApiKeyStore, Depends(key_store)],
    settings: SettingsDep,
) -> ApiKey:
    """The API key of the request.

    Raises:
        Problem: 401 without a valid key, 429 past the key's rate (with ``Retry-After``).
    """
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Problem(
            401,
            "Authentication required",
            f"send your API key as `Authorization: Bearer pbe_...`; {_MAKE_A_KEY}",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = keys.authenticate(credentials.credentials)
    if key is None:
        raise Problem(
            401,
            "Invalid API key",
            f"the API key is unknown, malformed or revoked; {_MAKE_A_KEY}",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    count_request(keys.redis, key, settings.RATE_LIMIT_PER_MINUTE)
    request.state.caller = key
    return key


def count_request(redis: Redis, key: ApiKey, per_minute: int) -> None:
    """Count the request in the key's current minute (the API's and the dashboard's requests share the count).

    Raises:
        Problem: 429 once the minute's count passes ``per_minute``.
    """
    now = time.time()
    window = int(now // 60)
    counter = f"pbe:rate:{key.id}:{window}"
    pipe = redis.pipeline()
    pipe.incr(counter)
    pipe.expire(counter, 120)
    count = int(pipe.execute()[0])
    if count > per_minute:
        retry_after = max(1, int((window + 1) * 60 - now) + 1)
        raise Problem(
            429,
            "Too many requests",
            f"this key may make {per_minute} requests a minute; retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )


Caller = Annotated[ApiKey, Depends(get_caller)]
