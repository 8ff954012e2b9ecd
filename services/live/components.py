"""What the running workers say they run with, kept in Redis for the gateway to read when it records a run's
manifest (``services.results.manifest``): the executors advertise the session sandboxes' image, the graders the hashes
of
the judge's prompts. The gateway imports neither executor nor grader code, so this is how it learns them::

    pbe:components    hash: sandbox_image -> "pybench-eval/sandbox:latest@sha256:...",
                            judge_prompt_hash:absolute -> "<hex>", judge_prompt_hash:pairwise -> "<hex>"

A later advertisement replaces an earlier one: the manifest records what the fleet ran with most recently.
"""

from redis import Redis

COMPONENTS_KEY = "pbe:components"

SANDBOX_IMAGE = "sandbox_image"


def judge_prompt_key(mode: str) -> str:
    """The field under which graders advertise the prompt hash of a judge mode (``absolute``, ``pairwise``)."""
    return f"judge_prompt_hash:{mode}"


def advertise(redis: Redis, values: dict[str, str]) -> None:
    """Record what this worker runs with (fields as above).

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    if values:
        redis.hset(COMPONENTS_KEY, mapping=values)  # type: ignore[arg-type]


def advertised(redis: Redis) -> dict[str, str]:
    """Everything the workers advertised; empty before any did.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    raw = redis.hgetall(COMPONENTS_KEY)
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()
    }
