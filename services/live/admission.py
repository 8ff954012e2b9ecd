"""The admission window: at most ``max_concurrency`` sessions of one evaluation are out of its hands at once.

An evaluation's runnable tasks wait in its window's *held* list; ``admit`` moves them, first in first out, to
its *admitted* set (and the caller enqueues their sessions on the shared RQ queue) while fewer than the limit are
admitted. A session leaves the set when it ends (``leave``), which makes room for the next. So:

- the model endpoint of an evaluation never sees more than ``max_concurrency`` sessions (and so requests) at
  once, however many executors and slots there are;
- the shared sessions queue holds at most ``max_concurrency`` jobs of each evaluation, and each finished session
  queues its successor at the tail: two evaluations take turns on the executors instead of the later one waiting
  for the whole of the earlier one;
- the queue's depth is the work executors can take now, which is what autoscaling should read.

Only ``services.lifecycle`` calls this module (it keeps the task states beside it). Keys, beside the evaluation's
others (``services.state``)::

    pbe:evaluation:<id>:held        list of task indexes waiting to be admitted, first out first
    pbe:evaluation:<id>:admitted    set of task indexes whose session is queued or running

Moving from held to admitted is one Lua script, so two gateways, executors or reconcilers admitting at once never
pass the limit.
"""

from redis import Redis

from services.state import evaluation_key

_ADMIT = """
local admitted = {}
while redis.call('SCARD', KEYS[2]) < tonumber(ARGV[1]) do
  local index = redis.call('LPOP', KEYS[1])
  if not index then break end
  if redis.call('SADD', KEYS[2], index) == 1 then table.insert(admitted, index) end
end
return admitted
"""

_HOLD = """
for i = 2, #ARGV do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0 then
    redis.call('LREM', KEYS[1], 0, ARGV[i])
    if ARGV[1] == 'front' then redis.call('LPUSH', KEYS[1], ARGV[i]) else redis.call('RPUSH', KEYS[1], ARGV[i]) end
  end
end
return redis.call('LLEN', KEYS[1])
"""


def _keys(evaluation_id: str) -> list[str]:
    return [evaluation_key(evaluation_id, "held"), evaluation_key(evaluation_id, "admitted")]


class AdmissionWindow:
    """The held list and admitted set of evaluations held in ``redis``."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._admit = redis.register_script(_ADMIT)
        self._hold = redis.register_script(_HOLD)

    def hold(self, evaluation_id: str, indexes: list[int], *, front: bool = False) -> None:
        """Put tasks in line to be admitted, at the back (or the ``front``: a retry goes before new work). A task
        already admitted or already held is not held twice (a held one moves to its new place)."""
        if indexes:
            self._hold(keys=_keys(evaluation_id), args=["front" if front else "back", *map(str, indexes)])

    def admit(self, evaluation_id: str, limit: int) -> list[int]:
        """Admit held tasks, first held first, while fewer than ``limit`` are admitted. Returns those admitted
        now (the caller enqueues their sessions)."""
        return [int(i) for i in self._admit(keys=_keys(evaluation_id), args=[limit])]

    def enter(self, evaluation_id: str, index: int) -> None:
        """Count a task as admitted whatever the limit (the reconciler queues again a session it finds lost)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrem(evaluation_key(evaluation_id, "held"), 0, str(index))
        pipe.sadd(evaluation_key(evaluation_id, "admitted"), str(index))
        pipe.execute()

    def leave(self, evaluation_id: str, indexes: list[int]) -> None:
        """The sessions of these tasks ended (or were cancelled): their places are free."""
        if indexes:
            self.redis.srem(evaluation_key(evaluation_id, "admitted"), *map(str, indexes))

    def is_admitted(self, evaluation_id: str, index: int) -> bool:
        return bool(self.redis.sismember(evaluation_key(evaluation_id, "admitted"), str(index)))

    def held(self, evaluation_id: str) -> list[int]:
        """The tasks waiting, in the order they will be admitted."""
        return [int(i) for i in self.redis.lrange(evaluation_key(evaluation_id, "held"), 0, -1)]

    def in_flight(self, evaluation_id: str) -> int:
        """How many tasks are admitted (their sessions queued or running)."""
        return int(self.redis.scard(evaluation_key(evaluation_id, "admitted")))

    def release_held(self, evaluation_id: str) -> list[int]:
        """Take every held task out of line (the evaluation was cancelled). Returns them."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.lrange(evaluation_key(evaluation_id, "held"), 0, -1)
        pipe.delete(evaluation_key(evaluation_id, "held"))
        held, _ = pipe.execute()
        return [int(i) for i in held]

    def forget(self, evaluation_id: str) -> None:
        """Drop the window of an evaluation whose tasks are all finished."""
        self.redis.delete(*_keys(evaluation_id))
