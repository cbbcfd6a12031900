"""``POST /v1/embeddings`` (also without ``/v1``): the generation endpoints' pipeline with an embeddings body.

Everything but the body is the chat path's (:mod:`gateway.serving.handler`): the key, the whole body and a slot in
that order; admission (the route must be an embeddings route, ``task: embed``; the worst case, the prompt alone,
reserved against the tenant's limits); the route's policy by load over ranked candidates, each on a dispatch
ticket, the next one taking the request if the first fails before answering; one access-log line, the metrics,
the spend and the ledger entry. Replicas are sent the body at their ``/v1/embeddings`` (SGLang ``--is-embedding``,
vLLM pooling models) and answer whole; hosted models are reached through litellm's ``aembedding``.
"""

from __future__ import annotations

from spillgate.gateway.observability.tracing import Tracing
from spillgate.gateway.serving.admission import Admission
from spillgate.gateway.serving.drain import Drain
from spillgate.gateway.serving.forwarding import Forwarder
from spillgate.gateway.serving.handler import CompletionsHandler
from spillgate.gateway.serving.hosted import HostedEmbeddingsUpstream
from spillgate.gateway.serving.observer import RequestObserver
from spillgate.gateway.serving.relay import relay_embeddings
from spillgate.gateway.serving.replica import ReplicaUpstream
from spillgate.gateway.serving.slots import InFlightLimit, ReadingBudget
from spillgate.gateway.serving.upstream import Upstream
from spillgate.gateway.state import GatewayState

EMBEDDINGS_PATH = "/v1/embeddings"


def embedding_upstreams(state: GatewayState) -> dict[str, Upstream]:
    """The upstream that serves embeddings on each kind of backend."""
    return {
        "replica": ReplicaUpstream(state.upstream, state.registry, state.metrics, whole=relay_embeddings),
        "hosted": HostedEmbeddingsUpstream(lambda: state.hosted_models),
    }


class EmbeddingsHandler(CompletionsHandler):
    """``POST /v1/embeddings``: the completions handler with embeddings' admission and upstreams."""

    def __init__(
        self,
        state: GatewayState,
        slots: InFlightLimit,
        reading: ReadingBudget,
        observer: RequestObserver,
        tracing: Tracing,
        drain: Drain | None = None,
    ) -> None:
        super().__init__(state, EMBEDDINGS_PATH, slots, reading, observer, tracing, drain)
        self.admission = Admission(state, tracing, chat=False, embeddings=True)
        self.forwarder = Forwarder(state, EMBEDDINGS_PATH, embedding_upstreams(state), tracing)
