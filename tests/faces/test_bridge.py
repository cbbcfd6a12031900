"""The bridge between a face and the chat handler: each request keeps its own translation, a chat 422 takes the
face's status, and an unreadable success is the gateway's failure."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from spillgate.gateway.faces.bridge import FaceHandler, StreamTranslator
from spillgate.gateway.tenancy.tenants import Tenant


class EchoExchange:
    """Names its answer after the model its request asked for."""

    def __init__(self) -> None:
        self.model = ""

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return headers

    async def request(self, tenant: Tenant | None, body: bytes) -> bytes:
        self.model = orjson.loads(body)["name"]
        return orjson.dumps({"model": self.model})

    async def whole(self, chat: dict[str, Any]) -> bytes:
        return orjson.dumps({"asked": self.model, "chat": chat["model"]})

    def stream(self) -> StreamTranslator:
        raise NotImplementedError

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return orjson.dumps({"type": "error", "message": error["message"]})

    def status(self, status: int) -> int:
        return 400 if status == 422 else status


class EchoFace:
    def exchange(self) -> EchoExchange:
        return EchoExchange()


def chat_answering(status: int, body: bytes, delay: float = 0.0) -> Any:
    async def chat(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = orjson.loads((await receive())["body"])
        await asyncio.sleep(delay if request["model"] == "slow" else 0)
        answer = body if body else orjson.dumps({"model": request["model"]})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return chat


async def call(handler: FaceHandler, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await handler({"type": "http", "headers": []}, receive, send)
    start, answer = sent
    length = dict(start["headers"])[b"content-length"]
    assert int(length) == len(answer["body"])
    return start["status"], orjson.loads(answer["body"])


def anyone(_: str | None) -> Tenant:
    return Tenant("t", frozenset({"*"}))


async def test_two_requests_at_once_each_answer_their_own() -> None:
    handler = FaceHandler(EchoFace(), chat_answering(200, b"", delay=0.05), anyone)
    (_, slow), (_, fast) = await asyncio.gather(call(handler, {"name": "slow"}), call(handler, {"name": "fast"}))
    assert slow == {"asked": "slow", "chat": "slow"} and fast == {"asked": "fast", "chat": "fast"}


async def test_an_error_takes_the_faces_status_and_shape() -> None:
    error = orjson.dumps({"error": {"message": "bad field", "type": "invalid_request_error"}})
    status, body = await call(FaceHandler(EchoFace(), chat_answering(422, error), anyone), {"name": "m"})
    assert status == 400 and body == {"type": "error", "message": "bad field"}


async def test_a_success_the_face_cannot_read_is_a_502() -> None:
    status, body = await call(FaceHandler(EchoFace(), chat_answering(200, b"not json"), anyone), {"name": "m"})
    assert status == 502 and "could not be read" in body["message"]
