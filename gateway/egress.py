"""The submitted endpoints, checked before an evaluation is accepted: no request forgery through our workers.

The model's and the judge's base URLs are resolved and every address checked (``services.endpoint.netguard``);
internal ones are refused unless the operator's ``PBE_EGRESS_ALLOWLIST`` names them. The workers check
again, and pin each connection to the address they checked, when they call the endpoint.
"""

from gateway.problems import Problem
from gateway.settings import GatewaySettings
from services.endpoint.netguard import (
    EgressPolicy,
    EgressRefusedError,
    Resolver,
    UnresolvableHostError,
    check_url,
    resolve_host,
)
from services.evaluation import EvaluationCreate


def check_endpoints(body: EvaluationCreate, settings: GatewaySettings, resolver: Resolver = resolve_host) -> None:
    """Check the submission's model (and judge) endpoint.

    Raises:
        Problem: 403 naming the endpoint and why the egress policy refuses it; 422 for a host that does not
            resolve (from here).
    """
    policy = EgressPolicy.parse(settings.EGRESS_ALLOWLIST)
    endpoints = [("model.base_url", body.model.base_url)]
    if body.judge is not None:
        endpoints.append(("judge.endpoint.base_url", body.judge.endpoint.base_url))
    for field, url in endpoints:
        _check(field, url, policy, resolver)


def check_url_field(field: str, url: str, settings: GatewaySettings, resolver: Resolver = resolve_host) -> None:
    """Check one endpoint URL, named ``field`` in the errors, against the egress policy.

    Raises:
        Problem: 403 naming the endpoint and why the policy refuses it; 422 for a host that does not resolve.
    """
    _check(field, url, EgressPolicy.parse(settings.EGRESS_ALLOWLIST), resolver)


def _check(field: str, url: str, policy: EgressPolicy, resolver: Resolver) -> None:
    try:
        check_url(url, policy, resolver)
    except UnresolvableHostError as exc:
        raise Problem(422, "Endpoint unresolvable", f"{field}: {exc}", field=field) from exc
    except EgressRefusedError as exc:
        raise Problem(403, "Endpoint refused", f"{field}: {exc}", field=field) from exc
