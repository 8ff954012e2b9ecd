"""The error tree of pybench-eval: every error class the services raise, wherever it is defined.

Library errors (docker, redis, httpx, websocket) are translated at the boundary into the most specific of
these, raised ``from`` the original. A class defined in another module names it on the right; the others
are defined here::

    PybenchEvalError
    ├── ConfigurationError                 a setting or deployment piece is missing or wrong
    ├── SuiteError                         a suite cannot be read
    │   └── TaskNotFoundError              a task index that the suite does not have
    ├── EvaluationNotFoundError            no evaluation by that id (or not the caller's)    services.state
    ├── SandboxError                       the sandbox failed, or a path not under /workspace
    │   ├── SandboxStartError              a sandbox did not start or become ready
    │   └── SandboxUnavailableError        the sandbox is gone (removed, kernel dead)
    ├── ModelEndpointError                 the model endpoint failed
    │   ├── ModelUnreachableError          no answer (connection refused, DNS, timeout)
    │   └── ModelResponseError             an answer that is not a usable chat completion
    │       ├── ModelContextLengthError    the conversation outgrew the model's context
    │       └── ModelRequestRejectedError  a 4xx other than 408/429 (unknown model, wrong
    │                                      key): the user's to fix, never retried
    ├── StoreError                         the artifact store cannot be read or written
    │   └── ArtifactNotFoundError          an artifact that is not there
    │       └── ArtifactExpiredError       it was there, and retention removed it (HTTP 410)
    ├── GatewayError                       the gateway answered an error (status, detail)    gateway.client
    ├── GatewayUnreachableError            the gateway could not be reached in time          gateway.client
    └── CommandError                       a CLI command cannot go on (exit status 1)        gateway.cli.errors
        ├── UsageError                     the command line is wrong (exit status 2)         gateway.cli.errors
        └── PreflightError                 an endpoint failed its check before submitting    gateway.cli.errors

Outside the tree, on purpose: bad values (caught as ``ValueError`` where they are checked), and errors that
never leave the module that raises them::

    ValueError                             a bad value, caught where it is checked
    ├── EgressRefusedError                 a URL or its host may not be reached              services.endpoint.netguard
    │   └── UnresolvableHostError          the host does not resolve: cannot be checked      services.endpoint.netguard
    └── CheckParameterError                a check's parameters do not fit its kind          grader.checks
    Exception
    ├── Problem                            an API error, answered as a problem document      gateway.problems
    ├── CheckFailed, MalformedCheck        a file check's outcome, in the grading sandbox    grader.file_checks
    └── _TooLarge                          too much output: a SandboxUnavailableError        services.sandbox.local

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


class ArtifactExpiredError(ArtifactNotFoundError):
    """A trajectory or produced file that retention (``PBE_RETENTION_DAYS``) removed: the message says when and
    by which setting; the evaluation's results and verdicts are kept and still readable."""


class ModelRequestRejectedError(ModelResponseError):
    """The endpoint refused the request with a 4xx other than 408 and 429 (an unknown model, a wrong key, a task
    it cannot serve): asking again cannot help, so the session ends and is not retried; the user must fix it."""
