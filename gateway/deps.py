"""FastAPI dependencies as ``Annotated`` aliases: settings, Redis, the state (read) and the task lifecycle (its
writes), the artifact store, the suite."""

from typing import Annotated

from fastapi import Depends, Request
from redis import Redis

from gateway.settings import GatewaySettings
from gateway.streams import OpenStreams
from services.lifecycle import TaskLifecycle
from services.pybench.suite import Suite, load_suite
from services.state import StateStore
from services.store import ArtifactStore


def get_settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


def get_redis(request: Request) -> Redis:
    redis: Redis = request.app.state.redis
    return redis


def get_streams(request: Request) -> OpenStreams:
    streams: OpenStreams = request.app.state.streams
    return streams


def get_state(
    redis: Annotated[Redis, Depends(get_redis)], settings: Annotated[GatewaySettings, Depends(get_settings)]
) -> StateStore:
    return StateStore(redis, settings.secret_box())


def get_lifecycle(
    redis: Annotated[Redis, Depends(get_redis)], settings: Annotated[GatewaySettings, Depends(get_settings)]
) -> TaskLifecycle:
    return TaskLifecycle(redis, settings.secret_box())


def get_store(settings: Annotated[GatewaySettings, Depends(get_settings)]) -> ArtifactStore:
    return ArtifactStore(settings.ARTIFACT_ROOT)


def get_suite(settings: Annotated[GatewaySettings, Depends(get_settings)]) -> Suite:
    """The configured suite.

    Raises:
        ConfigurationError: no suite at ``PBE_SUITE_PATH``.
    """
    return load_suite(settings.require_suite(), settings.SUITE_NAME)


SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
RedisDep = Annotated[Redis, Depends(get_redis)]
StateDep = Annotated[StateStore, Depends(get_state)]
LifecycleDep = Annotated[TaskLifecycle, Depends(get_lifecycle)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]
SuiteDep = Annotated[Suite, Depends(get_suite)]
StreamsDep = Annotated[OpenStreams, Depends(get_streams)]
