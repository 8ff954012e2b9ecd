"""The CLI's own errors; the gateway client's (``GatewayError``, ``GatewayUnreachableError``) pass through::

    PybenchEvalError
    └── CommandError          a command cannot go on (exit status 1)
        ├── UsageError        the command line is wrong (exit status 2)
        └── PreflightError    the model or judge endpoint failed the check before submitting

Every message says what to do next; ``main`` prints it as one ``error: ...`` line.
"""

from services.errors import PybenchEvalError


class CommandError(PybenchEvalError):
    exit_status = 1


class UsageError(CommandError):
    exit_status = 2


class PreflightError(CommandError):
    pass
