"""The epochs of a run: each epoch of a submission is an evaluation of its own (own sessions, sandboxes, attempts
and verdicts), and the run is the set of them, named by its first epoch's id.

What an epoch gets: its sampling seed (``epoch_seed``: ``sampling.seed`` plus the epoch less one when the user gave
one, else one derived from the run id and the epoch, so a run can be repeated from its record), and its share of
the submission's ``max_concurrency`` (``epoch_concurrency``), so a run of ten epochs calls the endpoint no harder
than a run of one.
"""

import hashlib

from services.evaluation import Sampling

SEED_LIMIT = 2**31
"""Seeds are below this (what endpoints accept as a 32-bit signed integer)."""


def epoch_seed(run_id: str, epoch: int, given: int | None) -> int:
    """The sampling seed of ``epoch`` (1-based) of run ``run_id``: ``given`` + epoch - 1 (wrapped below
    ``SEED_LIMIT``) when the submission gave one, else the first 4 bytes of SHA-256 of ``<run_id>:<epoch>``."""
    if given is not None:
        return (given + epoch - 1) % SEED_LIMIT
    digest = hashlib.sha256(f"{run_id}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % SEED_LIMIT


def epoch_sampling(sampling: Sampling, run_id: str, epoch: int, epochs: int) -> Sampling:
    """``sampling`` with the epoch's seed; a run of one epoch keeps what was given (no seed unless asked)."""
    if epochs == 1:
        return sampling
    return sampling.model_copy(update={"seed": epoch_seed(run_id, epoch, sampling.seed)})


def epoch_concurrency(max_concurrency: int, epochs: int) -> int:
    """Each epoch's share of the run's ``max_concurrency`` (at least 1)."""
    return max(1, max_concurrency // epochs)
