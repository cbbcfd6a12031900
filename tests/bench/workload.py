"""The one request every client of the benchmark sends, so wrk, the latency client and the smoke check agree."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

PATH = "/v1/chat/completions"
_PROMPT = "Write a short haiku about reverse proxies, latency and the event loop, please. " * 2


@dataclass(frozen=True, slots=True)
class Workload:
    """A chat completion request for ``model`` at ``host:port``, with a bearer key when the target wants one."""

    port: int
    model: str
    api_key: str | None = None
    host: str = "127.0.0.1"

    def body(self, stream: bool) -> bytes:
        return orjson.dumps(
            {
                "model": self.model,
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": _PROMPT},
                ],
                "max_tokens": 64,
                "temperature": 0.7,
                "stream": stream,
            }
        )

    def headers(self) -> dict[str, str]:
        """``content-type`` is required by sglang-router; ``authorization`` puts the gateway's auth on the path."""
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    def raw_request(self, stream: bool) -> bytes:
        """The whole HTTP/1.1 request as bytes, for a client that writes it in one go."""
        body = self.body(stream)
        lines = [f"POST {PATH} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in self.headers().items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def wrk_script(self, stream: bool) -> str:
        """A wrk Lua script that POSTs this request; the body sits in a long bracket, so needs no escaping."""
        lines = ['wrk.method = "POST"', f"wrk.body = [==[{self.body(stream).decode()}]==]"]
        lines += [f'wrk.headers["{name}"] = "{value}"' for name, value in self.headers().items()]
        return "\n".join(lines) + "\n"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{PATH}"
