"""litellm, imported so that it never reaches the network on its own, reads no .env file and logs
nothing about requests.

By default litellm fetches its model price map from GitHub at import (up to 5 s, then a background
retry thread) and, on first use, Anthropic beta-header and tokenizer files. The gateway must start
offline and answer from the bundled copies, so the switches are set before the import, and the
import is checked to have used the bundled price map. litellm's own DEBUG logs print whole prompts;
its loggers are set to WARNING (once, here: raise them again deliberately if needed) and their records
pass through a credential filter.

Importing this module imports litellm: 4-6 s on a 2-core machine. Do it at start-up, never on the
request path. The import itself is what makes the set-up happen once.
"""

from __future__ import annotations

import logging
import os
import sys

from spillgate.backends.hosted.scrub import RedactingFilter

# Set before ``import litellm``: each is read at import or at first use of the feature.
OFFLINE_ENVIRONMENT = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # price map from the package, no fetch at import
    "LITELLM_OFFLINE_MODE": "true",  # every catalog/tokenizer litellm would fetch by itself: bundled or skipped
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",  # Anthropic beta-header config from the package
    "LITELLM_MODE": "PRODUCTION",  # else litellm loads a .env file (from the working directory) into os.environ
}
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


class LitellmNotOffline(RuntimeError):
    """litellm was imported elsewhere first, without the offline switches, and fetched its price map."""


_imported_before = "litellm" in sys.modules
os.environ.update(OFFLINE_ENVIRONMENT)

import litellm  # noqa: E402  (after the switches above)
from litellm.litellm_core_utils.get_model_cost_map import get_model_cost_map_source_info  # noqa: E402

_source = get_model_cost_map_source_info()
if _source.get("source") != "local" or _source.get("is_env_forced") is not True:  # a fetch was at least tried
    raise LitellmNotOffline(
        f"litellm tried to fetch its price map from {_source.get('url')!r}: import backends.hosted.runtime "
        "before litellm" + (" (litellm was imported earlier)" if _imported_before else "")
    )

# No logging/telemetry callbacks (empty by default; cleared in case anything registered one at import).
for _callbacks in ("callbacks", "input_callback", "success_callback", "failure_callback", "service_callback"):
    getattr(litellm, _callbacks).clear()
litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner on stdout per exception
litellm.num_retries = 0  # the gateway decides about retries and fallback
litellm.turn_off_message_logging = True
for _name in LITELLM_LOGGERS:
    logging.getLogger(_name).setLevel(logging.WARNING)
    logging.getLogger(_name).addFilter(RedactingFilter())

__all__ = ["OFFLINE_ENVIRONMENT", "LitellmNotOffline", "litellm"]
