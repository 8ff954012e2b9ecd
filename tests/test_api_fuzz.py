"""Fuzzing the gateway's REST API from its own OpenAPI schema with schemathesis, every check on: no server
error, status codes, content types and bodies as documented, auth enforced.

The app runs in-process against the real Redis; generated bodies may name internal endpoints (refused by
the egress guard before any connection) or loopback ones that nothing listens on (nothing is queued that a
worker would run here). Examples are bounded per operation so the run takes seconds.
"""

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings
from redis import Redis

from gateway.app import create_app
from tests.fixtures import ADMIN_KEY, gateway_settings

EXAMPLES_PER_OPERATION = 30

SKIPPED = {"stream_evaluation_events"}
"""Operations left to tests/test_gateway.py: a never-ending stream until its evaluation ends."""


def test_every_operation_keeps_its_documented_contract(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    settings_ = gateway_settings(redis_url, suite_path, tmp_path, RATE_LIMIT_PER_MINUTE=1_000_000)
    # Generated host names resolve here, to a public address, never through DNS (nothing connects to it).
    app = create_app(settings_, resolver=lambda host, port: ["8.8.8.8"])
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    tested = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.definition.raw.get("operationId") in SKIPPED:
            continue
        tested.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {ADMIN_KEY}"})

        try:
            check()
        except Exception as exc:  # one report for every operation, not just the first that fails
            failures.append(f"{operation.label}: {exc}")
    assert len(tested) >= 14, tested
    assert not failures, "\n\n".join(failures)
