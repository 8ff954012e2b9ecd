"""The error tree of pybench-eval.

Library errors (docker, redis, httpx, websocket) are translated at the boundary into the most specific of
these, raised ``from`` the original::

    PybenchEvalError
    ├── ConfigurationError        a setting or a deployment piece is missing or wrong
    ├── SuiteError                a suite cannot be read
    │   └── TaskNotFoundError     a task index that the suite does not have
    ├── SandboxError              the sandbox misbehaved
    │   ├── SandboxStartError     a sandbox could not be started or did not become ready
    │   └── SandboxUnavailableError  the sandbox is gone (killed, removed, kernel dead)
    ├── ModelEndpointError        the model endpoint failed
    │   ├── ModelUnreachableError     no answer (connection refused, DNS, timeout)
    │   └── ModelResponseError        an answer that is not a usable chat completion
    │       ├── ModelContextLengthError   the conversation no longer fits the model's context
    │       └── ModelRequestRejectedError the endpoint refused the request (4xx other than 408/429): the user's
    │                                     to fix (unknown model, wrong key, a task it cannot serve), never retried
    └── StoreError                the artifact store cannot be read or written
        └── ArtifactNotFoundError an artifact that is not there

Each message says what to do next.
"""


class PybenchEvalError(Exception):
    """Base of every error raised by pybench-eval."""


class ConfigurationError(PybenchEvalError):
    pass


class SuiteError(PybenchEvalError):
    pass


class TaskNotFoundError(SuiteError):
    pass


class SandboxError(PybenchEvalError):
    pass


class SandboxStartError(SandboxError):
    pass


class SandboxUnavailableError(SandboxError):
    pass


class ModelEndpointError(PybenchEvalError):
    pass


class ModelUnreachableError(ModelEndpointError):
    pass


class ModelResponseError(ModelEndpointError):
    pass


class ModelContextLengthError(ModelResponseError):
    """The conversation no longer fits the model's context: the session ends (the agent's limit, not infra)."""


class StoreError(PybenchEvalError):
    pass


class ArtifactNotFoundError(StoreError):
    pass


class ModelRequestRejectedError(ModelResponseError):
    """The endpoint refused the request with a 4xx other than 408 and 429 (an unknown model, a wrong key, a task
    it cannot serve): asking again cannot help, so the session ends and is not retried; the user must fix it."""
