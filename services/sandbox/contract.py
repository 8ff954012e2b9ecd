"""The sandbox contract every service shares: the handle that re-attaches to a sandbox, and the image, names,
labels and paths that find one.

Every sandbox object (container, volume, network) carries ``PROJECT_LABEL`` and ``ROLE_LABEL``; a session's
sandbox also carries ``EVALUATION_LABEL``, ``TASK_LABEL`` and ``ATTEMPT_LABEL``. A session sandbox's name
starts with ``SANDBOX_NAME_PREFIX``, a grading sandbox's with ``GRADING_NAME_PREFIX``, so one pattern finds
each kind and ``reap`` removes what a crash left behind. The grader may not import executor code: what both
need lives here.
"""

import secrets
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

DEFAULT_SANDBOX_IMAGE = "pybench-eval/sandbox:latest"
"""The image sessions run in, and grading checks open produced files in (``make images`` builds it from
``services/sandbox/image/``)."""

RuntimeVolumeMode = Literal["auto", "on", "off"]
"""Whether Docker sandboxes read the image's ``/opt/venv`` and ``/usr`` from read-only volumes
(``services.sandbox.runtime_volumes``): ``auto`` where the engine's storage driver is FUSE, ``on``, ``off``."""

RUNTIME_COPY_ROLE = "sandbox-runtime"
"""The role of a volume that holds a copy of one of an image's folders, ``/opt/venv`` or ``/usr``
(``services.sandbox.runtime_volumes``)."""
RUNTIME_MARKER_ROLE = "sandbox-runtime-marker"
"""The role of the volume that names an image's published copy."""
RUNTIME_FILLER_ROLE = "sandbox-runtime-filler"
"""The role of the container, never started, whose creation makes the engine fill a set of copies; removed at once,
or, when its worker died first, by the next worker that serves the image."""
RUNTIME_ROLES = frozenset({RUNTIME_COPY_ROLE, RUNTIME_MARKER_ROLE})
"""Volumes made once per image for every sandbox to come: never a session's leftovers."""

DEFAULT_GATEWAY_PORT = 8888
"""The port a session sandbox's kernel gateway listens on (the image's ``jupyter_kernel_gateway_config.py``)."""

SANDBOX_HOME = "/home/sandbox"
"""The sandbox user's home: size-capped and in memory on every backend."""

SANDBOX_UID = 1000
"""The unprivileged user (and group) of the sandbox image: sessions and gradings run as it, on every backend, and
files copied into a session's workspace belong to it."""

LOG_LIMIT = {"max-size": "8m", "max-file": "1"}
"""The most a Docker sandbox's container log keeps (``json-file``, one file): what code writes to the container's
own stdout (``os.write(1, ...)``, a child process's output) cannot fill the engine's disk. A grading sandbox's
result line is read from its log, so the cap leaves room for it."""

WORKSPACE = "/workspace"
"""The sandbox's working directory: the kernel runs here, inputs go to ``./data``, results to ``./output``;
the only place files are copied into."""

PROJECT = "pybench-eval"
"""The value of ``PROJECT_LABEL`` on everything this project starts."""

SANDBOX_LABEL_PREFIX = "pybench-eval"
"""Prefix of the label keys every sandbox object carries (``pybench-eval.evaluation`` ...)."""

PROJECT_LABEL = f"{SANDBOX_LABEL_PREFIX}.project"
ROLE_LABEL = f"{SANDBOX_LABEL_PREFIX}.role"
"""What the object is: ``SANDBOX_ROLE``, ``GRADING_ROLE``, or a backend's own (``sandbox-workspace`` ...)."""
EVALUATION_LABEL = f"{SANDBOX_LABEL_PREFIX}.evaluation"
TASK_LABEL = f"{SANDBOX_LABEL_PREFIX}.task"
ATTEMPT_LABEL = f"{SANDBOX_LABEL_PREFIX}.attempt"
WORKER_LABEL = f"{SANDBOX_LABEL_PREFIX}.worker"
"""The executor that started a session's sandbox (a warm one too): its next life removes what it left."""

SANDBOX_ROLE = "sandbox"
"""The role of a task session's sandbox."""

UNATTENDED_LIFETIME_S = 3600
"""A sandbox with nothing to serve (a grading's: its process 1 only sleeps) ends by itself after this long, should the
process that started it die before it stops it (a grading's checks take a minute at most); ``reap`` removes it."""

GRADING_ROLE = "grading-sandbox"
"""The role of a grading sandbox (the container that opens produced files for the checks) and its volume."""

SANDBOX_NAME_PREFIX = "pbe-sbx-"
"""Every session sandbox's name starts with this, so one pattern finds them all."""

GRADING_NAME_PREFIX = "pbe-grd-"
"""Every grading sandbox's (and its volume's) name starts with this."""

SandboxPurpose = Literal["session", "grading"]
"""What a sandbox is started for: a task ``session`` (a kernel gateway the executor talks to) or a ``grading`` (a
box that runs nothing of its own, in which the grader ``exec``s the checker)."""

PURPOSE_ROLES: dict[SandboxPurpose, str] = {"session": SANDBOX_ROLE, "grading": GRADING_ROLE}
"""The ``ROLE_LABEL`` of a sandbox by its purpose."""

GRADING_LABELS = {ROLE_LABEL: GRADING_ROLE, PROJECT_LABEL: PROJECT}
"""The labels of every grading sandbox (container, volume or pod)."""


def grading_name() -> str:
    """A new name for a grading sandbox: ``pbe-grd-<12 hex>``."""
    return f"{GRADING_NAME_PREFIX}{secrets.token_hex(6)}"


def sandbox_name(evaluation_id: str, task_index: int, attempt: int) -> str:
    """A new name for a session's sandbox: ``pbe-sbx-<first 12 of the evaluation id>-<task>-a<attempt>-<6 hex>``."""
    return f"{SANDBOX_NAME_PREFIX}{evaluation_id[:12]}-{task_index}-a{attempt}-{secrets.token_hex(3)}"


def sandbox_labels(evaluation_id: str, task_index: int, attempt: int, worker: str = "") -> dict[str, str]:
    """The labels of a session's sandbox (``WORKER_LABEL`` when the ``worker`` that starts it is named)."""
    labels = {
        PROJECT_LABEL: PROJECT,
        ROLE_LABEL: SANDBOX_ROLE,
        EVALUATION_LABEL: evaluation_id,
        TASK_LABEL: str(task_index),
        ATTEMPT_LABEL: str(attempt),
    }
    if worker:
        labels[WORKER_LABEL] = worker
    return labels


def reap_selector(evaluation_id: str | None = None, worker: str | None = None) -> dict[str, str]:
    """The labels (key: value) a session's sandbox must carry to be removed by a ``reap`` that names an
    evaluation and/or a worker; empty: any sandbox of the project."""
    wanted = {}
    if evaluation_id is not None:
        wanted[EVALUATION_LABEL] = evaluation_id
    if worker is not None:
        wanted[WORKER_LABEL] = worker
    return wanted


class SandboxHandle(BaseModel):
    """A started sandbox as data: enough to re-attach to it from another process, or to clean it up."""

    backend: str
    sandbox_id: str
    name: str
    url: str
    """The kernel gateway's base URL as the executor reaches it, e.g. ``http://172.18.0.5:8888``."""
    token: str = Field(repr=False)
    """The kernel gateway's auth token: the sandbox's own, never a user secret; kept out of reprs and logs."""
    image: str
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    labels: dict[str, str] = Field(default_factory=dict)


def docker_created_epoch(stamp: str) -> float:
    """Seconds since the epoch of a Docker timestamp (``2026-11-23T03:34:00.123456789Z``); 0 if unreadable.

    Both the executor's sandboxes and the grader's grading sandboxes are reaped by age with it.
    """
    try:
        return datetime.fromisoformat(stamp[:19]).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0
