"""Hosted frontier models (OpenAI, Anthropic, Bedrock, any OpenAI-compatible API) through litellm.

``client.complete(model, payload)`` sends one OpenAI-format chat request and returns a
``HostedCompletion`` (whole body) or a ``HostedStream`` (OpenAI SSE bytes, relayed as they come), with
usage and cost; failures are ``HostedError`` with a ``kind`` the gateway can act on. litellm is
imported offline and only by ``client``/``pricing`` (it takes seconds): this package's root stays light.
"""

from spillgate.backends.hosted.errors import ErrorKind, HostedError
from spillgate.backends.hosted.model import HostedModel
from spillgate.backends.hosted.pricing import Price, PriceOverride, UnknownModelPrice
from spillgate.backends.hosted.response import HostedCompletion, Usage
from spillgate.backends.hosted.stream import HostedStream

__all__ = [
    "ErrorKind",
    "HostedCompletion",
    "HostedError",
    "HostedModel",
    "HostedStream",
    "Price",
    "PriceOverride",
    "UnknownModelPrice",
    "Usage",
]
