"""The model as one session sees it: the evaluation's endpoint, through its reply cache when it keeps one, each
paid call charged to its spend when it has a cost limit."""

from collections.abc import Mapping, Sequence
from typing import Any

from services.endpoint.client import ChatMessage, Completion, EndpointClient
from services.evaluation import Evaluation, Prices
from services.live.replies import ReplyCache, request_key
from services.live.spend import SpendLedger


class SessionModel:
    """Asks the evaluation's endpoint for completions (``complete``, as ``EndpointClient``'s).

    With ``replies``: a request asked before (``services.live.replies.request_key``) is answered from the cache,
    ``replayed`` set, without a call; a paid reply is kept. With ``ledger`` (and the evaluation's prices): each
    paid call's tokens are charged to the evaluation's spend, and ``spent_usd`` reads it.
    """

    def __init__(
        self,
        endpoint: EndpointClient,
        evaluation: Evaluation,
        *,
        replies: ReplyCache | None = None,
        ledger: SpendLedger | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.evaluation = evaluation
        self.replies = replies
        # What a paid call is charged to, and at what prices: both or neither (no prices, nothing is counted).
        self._charge: tuple[SpendLedger, Prices] | None = None
        if ledger is not None and evaluation.prices is not None:
            self._charge = (ledger, evaluation.prices)

    def complete(
        self,
        messages: Sequence[ChatMessage],
        sampling: Mapping[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        """One completion: replayed from the cache, or asked of the endpoint (and kept, and charged).

        Raises:
            What ``EndpointClient.complete`` raises, for a call made.
        """
        key = None
        if self.replies is not None:
            key = request_key(
                self.evaluation.model.base_url,
                self.evaluation.model.model,
                messages,
                sampling or {},
                tools,
                self.evaluation.epoch,
            )
            kept = self.replies.get(key)
            if kept is not None:
                return kept
        completion = self.endpoint.complete(messages, sampling, tools)
        if self._charge is not None:
            ledger, prices = self._charge
            ledger.charge(prices, completion.prompt_tokens, completion.completion_tokens)
        if self.replies is not None and key is not None:
            self.replies.put(key, completion)
        return completion

    def spent_usd(self) -> float | None:
        """What the evaluation has spent so far at its prices; None when it is not counted (no prices)."""
        return self._charge[0].spent_usd() if self._charge is not None else None
