"""Endpoint preflight: before an evaluation is accepted, its model endpoint must answer, serve the model, and
reply to one canary prompt with code in the format the chosen suite prompt asks for.

The calls go through the one endpoint client (``services.endpoint.client``), once each (no retries: the submitter is
waiting), and through the egress guard (the address checked, the connection pinned to it, no redirects); the
model's API key is sent as a bearer token and cut out of anything the endpoint echoes back. Each failure is a
problem document (422) that says what to fix; nothing is stored or queued.
"""

import httpx

from gateway.problems import Problem
from services.endpoint.client import EndpointClient, Reply
from services.endpoint.netguard import EgressPolicy, EgressRefusedError, PinnedTransport, Resolver, resolve_host
from services.endpoint.redaction import redact
from services.errors import ModelEndpointError
from services.evaluation import EvaluationCreate
from services.pybench.extraction import extract_code
from services.pybench.suite import Suite

CANARY_QUESTION = "Use Python to compute 17 * 23 and print the result."
"""The canary prompt, asked under the evaluation's own system prompt."""

DEFAULT_TIMEOUT_S = 60.0
"""How long each preflight request may take, per read and in all (a cold model server may be slow to answer
once)."""

PREFLIGHT_MAX_REPLY_BYTES = 256 * 2**10
"""The most bytes of the canary's answer read: a short reply to a short prompt."""

PREFLIGHT_MAX_LISTING_BYTES = 2**20
"""The most bytes of the endpoint's ``/models`` answer read (an answer of 1.2 GB once grew the gateway by 2.4 GiB)."""

CANARY_MAX_TOKENS = 400


def _refused(title: str, detail: str) -> Problem:
    return Problem(422, title, f'{detail}; fix the endpoint, or submit with "preflight": false', check="preflight")


def preflight(
    body: EvaluationCreate,
    suite: Suite,
    policy: EgressPolicy,
    *,
    resolver: Resolver = resolve_host,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> None:
    """Check the submission's model endpoint.

    Raises:
        Problem: 422 when the endpoint does not answer, does not serve the model, or replies to the canary
            without code in the prompt's format; 403 when the egress policy refuses it.
    """
    base = body.model.base_url
    key = body.api_key.get_secret_value() if body.api_key else None
    client = EndpointClient(
        base,
        body.model.model,
        api_key=key,
        timeout_s=timeout_s,
        deadline_s=timeout_s,
        max_reply_bytes=PREFLIGHT_MAX_REPLY_BYTES,
        max_listing_bytes=PREFLIGHT_MAX_LISTING_BYTES,
        retries=0,
        transport=transport or PinnedTransport(policy, resolver=resolver),
    )
    with client:
        served = _models(client, key)
        if served is not None and body.model.model not in served:
            listed = ", ".join(served[:10]) or "none"
            raise _refused("Model not served", f"{base} does not serve {body.model.model!r}; it serves: {listed}")
        _canary(client, body, suite, key)


def _answered(reply: Reply, key: str | None) -> int:
    """The reply's status.

    Raises:
        Problem: 403 for a URL the egress policy refuses, 422 when no answer came.
    """
    if reply.status is not None:
        return reply.status
    failure = reply.failure
    if isinstance(failure, EgressRefusedError):
        raise Problem(403, "Endpoint refused", f"model.base_url: {failure}") from failure
    if isinstance(failure, httpx.TimeoutException):
        raise _refused("Endpoint timed out", f"{reply.url} did not answer in time") from failure
    raise _refused(
        "Endpoint unreachable", f"{reply.url}: {type(failure).__name__}: {redact(str(failure), key)[:200]}"
    ) from failure


def _models(client: EndpointClient, key: str | None) -> list[str] | None:
    """The model ids the endpoint lists; None when it has no ``/models`` (some servers do not)."""
    reply = client.listing()
    status = _answered(reply, key)
    if status in (401, 403):
        raise _refused("Endpoint refused the key", f"{reply.url} answered HTTP {status}: check api_key")
    if status == 404:
        return None
    try:
        return reply.models()
    except ModelEndpointError as exc:
        raise _refused(
            "Not an OpenAI-compatible endpoint",
            f"{reply.url} answered HTTP {status} without a model list: {reply.text[:200]}",
        ) from exc


def _canary(client: EndpointClient, body: EvaluationCreate, suite: Suite, key: str | None) -> None:
    settings = suite.prompt_config(body.prompt).sampling | body.sampling.model_dump(exclude_none=True)
    messages = [
        {"role": "system", "content": suite.system_prompt(body.prompt)},
        {"role": "user", "content": CANARY_QUESTION},
    ]
    reply = client.chat(messages, {**settings, "max_tokens": CANARY_MAX_TOKENS})
    status = _answered(reply, key)
    if status != 200:
        raise _refused("Canary prompt failed", f"{reply.url} answered HTTP {status}: {reply.text[:200]}")
    try:
        text = reply.completion().text
    except ModelEndpointError as exc:
        raise _refused(
            "Not a chat completion", f"the canary reply is not a chat completion: {reply.text[:200]}"
        ) from exc
    if extract_code(text) is None:
        raise _refused(
            "No code in the canary reply",
            f"asked {CANARY_QUESTION!r} under the {body.prompt!r} prompt, the model replied without code in that "
            f"format: {text[:200]!r}; try another prompt",
        )
