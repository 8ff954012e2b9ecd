"""Endpoint preflight: before an evaluation is accepted, its model endpoint must answer, serve the model, and
reply to one canary prompt with code in the format the chosen suite prompt asks for.

The calls go through the egress guard (the address checked, the connection pinned to it, no redirects); the
model's API key is sent as a bearer token and cut out of anything the endpoint echoes back. Each failure is a
problem document (422) that says what to fix; nothing is stored or queued.
"""

from typing import Any

import httpx

from gateway.problems import Problem
from services.evaluation import EvaluationCreate
from services.extraction import extract_code
from services.netguard import EgressPolicy, EgressRefusedError, PinnedTransport, Resolver, resolve_host
from services.redaction import redact as redact_secret
from services.suite import Suite

CANARY_QUESTION = "Use Python to compute 17 * 23 and print the result."
"""The canary prompt, asked under the evaluation's own system prompt."""

DEFAULT_TIMEOUT_S = 60.0
"""How long each preflight request may take (a cold model server may be slow to answer once)."""

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
    key = body.api_key.get_secret_value() if body.api_key else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    base = body.model.base_url

    def redact(text: str) -> str:
        return redact_secret(text, key)

    client = httpx.Client(
        base_url=base,
        headers=headers,
        timeout=httpx.Timeout(timeout_s, connect=10.0),
        transport=transport or PinnedTransport(policy, resolver=resolver),
        follow_redirects=False,
    )
    try:
        served = _models(client, base, redact)
        if served is not None and body.model.model not in served:
            listed = ", ".join(served[:10]) or "none"
            raise _refused("Model not served", f"{base} does not serve {body.model.model!r}; it serves: {listed}")
        _canary(client, body, suite, redact)
    except EgressRefusedError as exc:
        raise Problem(403, "Endpoint refused", f"model.base_url: {exc}") from exc
    finally:
        client.close()


def _call(client: httpx.Client, method: str, path: str, redact: Any, **kwargs: Any) -> httpx.Response:
    try:
        return client.request(method, path, **kwargs)
    except httpx.TimeoutException as exc:
        raise _refused("Endpoint timed out", f"{client.base_url}{path} did not answer in time") from exc
    except httpx.TransportError as exc:
        raise _refused(
            "Endpoint unreachable", f"{client.base_url}{path}: {type(exc).__name__}: {redact(str(exc))[:200]}"
        ) from exc


def _models(client: httpx.Client, base: str, redact: Any) -> list[str] | None:
    """The model ids the endpoint lists; None when it has no ``/models`` (some servers do not)."""
    response = _call(client, "GET", "/models", redact)
    if response.status_code in (401, 403):
        raise _refused("Endpoint refused the key", f"{base}/models answered HTTP {response.status_code}: check api_key")
    if response.status_code == 404:
        return None
    try:
        data = response.json()["data"]
        return [str(item["id"]) for item in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise _refused(
            "Not an OpenAI-compatible endpoint",
            f"{base}/models answered HTTP {response.status_code} without a model list: {redact(response.text)[:200]}",
        ) from exc


def _canary(client: httpx.Client, body: EvaluationCreate, suite: Suite, redact: Any) -> None:
    settings = suite.prompt_config(body.prompt).sampling | body.sampling.model_dump(exclude_none=True)
    request = {
        "model": body.model.model,
        "messages": [
            {"role": "system", "content": suite.system_prompt(body.prompt)},
            {"role": "user", "content": CANARY_QUESTION},
        ],
        **settings,
        "max_tokens": CANARY_MAX_TOKENS,
    }
    response = _call(client, "POST", "/chat/completions", redact, json=request)
    if response.status_code != 200:
        raise _refused(
            "Canary prompt failed",
            f"{client.base_url}/chat/completions answered HTTP {response.status_code}: {redact(response.text)[:200]}",
        )
    try:
        text = str(response.json()["choices"][0]["message"].get("content") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise _refused(
            "Not a chat completion", f"the canary reply is not a chat completion: {redact(response.text)[:200]}"
        ) from exc
    if extract_code(text) is None:
        raise _refused(
            "No code in the canary reply",
            f"asked {CANARY_QUESTION!r} under the {body.prompt!r} prompt, the model replied without code in that "
            f"format: {redact(text)[:200]!r}; try another prompt",
        )
