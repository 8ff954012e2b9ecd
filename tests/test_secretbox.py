"""API keys held in Redis are sealed: never in its append-only file or snapshot in plain text, opened only under
the name they were stored under and the key that sealed them; without a secrets key, keyed submissions are refused
and nothing is stored."""

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from gateway.app import create_app
from services.errors import ConfigurationError
from services.lifecycle import TaskLifecycle
from services.live.secretbox import SecretBox, SecretsKeyMissingError, new_key
from services.pybench.suite import load_suite
from services.state import StateStore
from tests.factories import make_evaluation
from tests.fixtures import ADMIN_KEY, BODY, gateway_settings, test_secrets
from tests.servers import RedisServer

CANARY = "sk-sealed-canary-" + "7f3a9c" * 4


def test_a_sealed_key_opens_only_under_its_name_and_its_key() -> None:
    box = SecretBox.from_setting(new_key())
    sealed = box.seal(CANARY, "pbe:secret:model-key:a")
    assert CANARY.encode() not in sealed and len(sealed) == 12 + len(CANARY) + 16
    assert box.open(sealed, "pbe:secret:model-key:a") == CANARY
    assert box.seal(CANARY, "pbe:secret:model-key:a") != sealed, "a fresh nonce per seal"
    assert box.open(sealed, "pbe:secret:model-key:b") is None, "copied to another evaluation's name"
    assert SecretBox.from_setting(new_key()).open(sealed, "pbe:secret:model-key:a") is None, "another key"
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    assert box.open(tampered, "pbe:secret:model-key:a") is None
    assert box.open(b"short", "pbe:secret:model-key:a") is None


@pytest.mark.parametrize(
    "value",
    ["", "not base64 at all!", "c2hvcnQ=", new_key() + "AAAA"],
    ids=["empty", "not-base64", "too-short", "too-long"],
)
def test_a_secrets_key_that_is_not_one_says_how_to_make_one(value: str) -> None:
    with pytest.raises(ConfigurationError, match="make env writes one"):
        SecretBox.from_setting(value)


def test_keys_never_reach_redis_files_in_plain_text(tmp_path: Path, suite_path: Path) -> None:
    """On a persistent Redis, after a snapshot and a rewrite of the append-only file, the key's Redis name is in
    its files and its value is not; the store still opens it."""
    server = RedisServer(tmp_path, persistent=True)
    server.start()
    redis = Redis.from_url(server.url)
    try:
        suite = load_suite(suite_path)
        evaluation = make_evaluation("sealed", [7], max_turns=1, has_api_key=True, has_judge_api_key=True)
        TaskLifecycle(redis, test_secrets()).create(evaluation, suite, api_key=CANARY, judge_api_key=CANARY + "j")
        StateStore(redis, test_secrets()).set_keys("sealed", CANARY, None)  # as PUT .../keys
        redis.save()
        redis.bgrewriteaof()
        deadline = time.monotonic() + 30
        while redis.info("persistence")["aof_rewrite_in_progress"] and time.monotonic() < deadline:
            time.sleep(0.05)
        files = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
        assert b"pbe:secret:model-key:sealed" in files, "the test must read the files that hold the keys"
        assert CANARY.encode() not in files
        state = StateStore(redis, test_secrets())
        assert state.model_key("sealed") == CANARY and state.judge_key("sealed") == CANARY + "j"
        assert StateStore(redis).model_key("sealed") is None, "without the secrets key a held key counts as lost"
        with pytest.raises(SecretsKeyMissingError, match="PBE_SECRETS_KEY"):
            StateStore(redis).set_keys("sealed", CANARY, None)
    finally:
        redis.close()
        server.stop()


def test_without_a_secrets_key_keyed_submissions_get_503_and_nothing_is_stored(
    redis_url: str, redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    settings = gateway_settings(redis_url, suite_path, tmp_path, SECRETS_KEY="")
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as api:
        refused = api.post("/v1/evaluations", json={**BODY, "api_key": CANARY})
        assert refused.status_code == 503 and "PBE_SECRETS_KEY" in refused.json()["detail"]
        assert CANARY not in refused.text
        assert api.get("/v1/evaluations").json()["items"] == []
        assert not (tmp_path / "evaluations").exists() or not any((tmp_path / "evaluations").iterdir())
        keyless = api.post("/v1/evaluations", json=BODY)
        assert keyless.status_code == 201, keyless.text
