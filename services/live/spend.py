"""What an evaluation has spent on model calls, at its prices, so that a cost limit holds across its sessions.

Every executor running one of its sessions adds the cost of each model call it made (a reply replayed from the
cache costs nothing); a session stops before its next turn once the total reaches ``budgets.max_cost_usd``.
Sessions run at once, so the total may pass the limit by the calls already in flight (one per running session).

Keys (``pbe:``)::

    pbe:evaluation:<id>:spent      micro-USD spent on the evaluation's model calls (an integer, INCRBY)
"""

from redis import Redis

from services.evaluation import Prices
from services.state import evaluation_key

MICRO = 1_000_000


class SpendLedger:
    """The spend of one evaluation, the one writer of its ``spent`` key. Raises RedisError when Redis fails."""

    def __init__(self, redis: Redis, evaluation_id: str) -> None:
        self.redis = redis
        self.key = evaluation_key(evaluation_id, "spent")

    def charge(self, prices: Prices, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        """Add the cost of one call's tokens (those the endpoint reported) at ``prices``; returns the new total."""
        cost = prices.cost_usd(prompt_tokens or 0, completion_tokens or 0)
        return int(self.redis.incrby(self.key, round(cost * MICRO))) / MICRO

    def spent_usd(self) -> float:
        """The total so far (0 before the first call)."""
        raw = self.redis.get(self.key)
        return int(raw) / MICRO if raw is not None else 0.0
