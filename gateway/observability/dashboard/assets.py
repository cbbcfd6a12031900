"""The page's files, read from the installed package (``gateway/observability/dashboard/static``) and served only by
name from a fixed list, so no path can reach outside it."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi.responses import Response

from spillgate.gateway.errors import ApiError

MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "keys.js": "text/javascript; charset=utf-8",
}

SECURITY_HEADERS = {
    # Everything comes from the gateway itself: a page that could load scripts or send data elsewhere
    # would be an exfiltration path for the keys it holds.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


@cache
def _read(name: str) -> bytes:
    return resources.files("spillgate.gateway.observability.dashboard").joinpath("static", name).read_bytes()


def asset_response(name: str) -> Response:
    media_type = MEDIA_TYPES.get(name)
    if media_type is None:
        raise ApiError(404, "Not found.")
    return Response(_read(name), media_type=media_type, headers=SECURITY_HEADERS)
