"""The executor's name for the one endpoint client: ``services.endpoint.EndpointClient`` (kept so that older
imports, such as ``scripts/replay_fidelity.py``, keep working; new code imports ``services.endpoint``)."""

from services.endpoint import Completion, EndpointClient

ModelClient = EndpointClient
"""The agent's model client: ``services.endpoint.EndpointClient`` (see there for the retries and the errors)."""

__all__ = ["Completion", "ModelClient"]
