"""Which routes serve embeddings: a route's task is its targets' (the config refuses a route that mixes them).

Looked up on every generation and embeddings request, so it is a set of names rebuilt only when a config version
swaps in its routes (a new ``state.routes``), and the check on the hot path is an identity test and a set lookup.
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
    """The running config's embedding routes, remembered per version of the routes."""

    __slots__ = ("_embedding", "_routes")

    def __init__(self) -> None:
        self._routes: object = None
        self._embedding: frozenset[str] = frozenset()

    def embeds(self, state: GatewayState, route: str) -> bool:
        """Whether ``route`` (a name in ``state.routes``) serves embeddings."""
        if state.routes is not self._routes:
            # A config version swaps in its routes and its config in one step: they always match here.
            self._embedding = embedding_routes(state.config)
            self._routes = state.routes
        return route in self._embedding


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
