"""Subscribe to an engine's KV-cache event publisher (ZMQ) and write each batch as a JSON line.

Run with an engine's Python (it has ``pyzmq`` and ``msgspec``, which both engines encode with): ``kv_listen.py
ENDPOINT OUT [--bind]``. SGLang binds its publisher, so the listener connects; vLLM connects to a host it is given,
so the listener binds. Each message is ``[topic, sequence (8 bytes, big-endian), msgpack batch]``; the batch is
decoded as it is, tags and all, and written with its topic and sequence. Stops on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys

import msgspec
import zmq


def _plain(value: object) -> object:
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def main(endpoint: str, out: str, bind: bool) -> None:
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    socket = zmq.Context().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.bind(endpoint) if bind else socket.connect(endpoint)
    with open(out, "a", buffering=1) as lines:
        lines.write(json.dumps({"listening": endpoint}) + "\n")
        while running:
            if not socket.poll(200):
                continue
            topic, sequence, payload = socket.recv_multipart()
            batch = msgspec.msgpack.decode(payload)
            record = {"topic": topic.decode(), "seq": int.from_bytes(sequence, "big"), "batch": _plain(batch)}
            lines.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--bind" in sys.argv[3:])
