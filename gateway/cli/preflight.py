"""The check before a submission: the model (or judge) endpoint answers ``GET /models`` and serves the model.

It runs from the CLI's machine; when only the workers can reach the endpoint (a compose service name, a
cluster address), ``--no-preflight`` skips it.
"""

import httpx

from services.endpoint.client import EndpointClient
from services.errors import ModelEndpointError

from .errors import PreflightError

DEFAULT_PREFLIGHT_TIMEOUT_S = 10.0
"""How long the endpoint has to answer ``GET /models``."""

MAX_LISTED_MODELS = 20
"""How many served model names an error lists."""


def served_models(
    base_url: str,
    api_key: str | None,
    *,
    role: str = "model",
    timeout_s: float = DEFAULT_PREFLIGHT_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> list[str]:
    """The ids of the models an OpenAI-compatible endpoint lists at ``{base_url}/models``, asked once (through
    ``services.endpoint.client``, without retries: the user is waiting).

    ``role`` (``model`` or ``judge``) names the endpoint in messages; the key is sent as a bearer token and
    never appears in one.

    Raises:
        PreflightError: no answer, an error status, or an answer that is not a model list.
    """
    flag = f"--{role}-url"
    client = EndpointClient(
        base_url,
        api_key=api_key,
        role=role,
        timeout_s=timeout_s,
        connect_timeout_s=timeout_s,
        retries=0,
        transport=transport,
    )
    with client:
        reply = client.listing()
    url = reply.url
    if reply.status is None:
        problem = str(reply.failure) or type(reply.failure).__name__
        raise PreflightError(
            f"the {role} endpoint is unreachable: GET {url} failed ({problem}); check "
            f"{flag} as this machine reaches it, or pass --no-preflight if only the workers can reach it"
        ) from reply.failure
    if reply.status in (401, 403):
        raise PreflightError(
            f"the {role} endpoint refused the request (GET {url}: HTTP {reply.status}); put its API key in "
            f"an environment variable and name it with --{role}-key-env"
        )
    if reply.status != 200:
        raise PreflightError(
            f"the {role} endpoint answered GET {url} with HTTP {reply.status}; is {flag} the base URL of "
            "an OpenAI-compatible API (ending in /v1)?"
        )
    try:
        return reply.models()
    except ModelEndpointError as exc:
        raise PreflightError(
            f'the {role} endpoint\'s answer to GET {url} is not a model list ({{"data": [{{"id": ...}}]}}); is '
            f"{flag} the base URL of an OpenAI-compatible API (ending in /v1)?"
        ) from exc


def check_model(base_url: str, model: str, api_key: str | None, *, role: str = "model") -> None:
    """Check that the endpoint at ``base_url`` serves ``model``.

    Raises:
        PreflightError: it does not answer as an OpenAI-compatible API, or does not list ``model``; the
            message lists the models it serves.
    """
    served = served_models(base_url, api_key, role=role)
    if model not in served:
        listed = ", ".join(served[:MAX_LISTED_MODELS]) + (" ..." if len(served) > MAX_LISTED_MODELS else "")
        raise PreflightError(
            f"the {role} endpoint {base_url} does not serve {model!r}; it serves: {listed or 'nothing'} "
            f"(pass one of them with {'--model' if role == 'model' else f'--{role}-model'})"
        )
