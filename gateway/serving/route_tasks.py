"""Which routes serve embeddings: a route's task is its targets' (the config refuses a route that mixes them).

Looked up on every generation and embeddings request, so it is a set of names rebuilt only when a config version
swaps in its routes (a new ``state.routes``), and the check on the hot path is an identity test and a set lookup,
made inline (no call) by :class:`~gateway.serving.admission.Admission`.
"""

from __future__ import annotations

from spillgate.gateway.control.config import GatewayConfig
from spillgate.gateway.errors import ApiError
from spillgate.gateway.state import GatewayState


def embedding_routes(config: GatewayConfig) -> frozenset[str]:
    """The names and aliases of the routes whose targets are ``task: embed``."""
    embed = {p.name for p in config.pools if p.task == "embed"} | {
        h.name for h in config.hosted_models if h.task == "embed"
    }
    return frozenset(
        name
        for route in config.routes
        if route.targets and all(target in embed for target in route.targets)
        for name in (route.name, *route.aliases)
    )


class RouteTasks:
    """The running config's embedding routes, remembered per version of the routes.

    Read inline on the hot path (``routes`` and ``embedding`` are public): ``if state.routes is not tasks.routes:
    tasks.refresh(state)``, then ``name in tasks.embedding``."""

    __slots__ = ("embedding", "routes")

    def __init__(self) -> None:
        self.routes: object = None
        """The ``state.routes`` the set was built for."""
        self.embedding: frozenset[str] = frozenset()

    def refresh(self, state: GatewayState) -> None:
        """Rebuild for the routes now running. A config version swaps in its routes and its config in one step,
        so they always match here."""
        self.embedding = embedding_routes(state.config)
        self.routes = state.routes


def wrong_task(model: str, *, embeddings_route: bool) -> ApiError:
    """The 400 for a request to a route of the other task, naming ``model`` and the endpoint it takes."""
    if embeddings_route:
        message = (
            f"The model '{model}' is an embeddings model: call POST /v1/embeddings with it, not a generation endpoint."
        )
    else:
        message = (
            f"The model '{model}' is a generation model and does not serve embeddings: call POST /v1/embeddings "
            "with an embeddings model."
        )
    return ApiError(400, message, param="model", code="wrong_model_task")
