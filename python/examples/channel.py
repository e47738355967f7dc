"""The request protocol between the GPU refit example's driver and its engine and trainer
processes: one JSON object per line over a pair of pipes (file descriptors passed to the child),
so library output on the child's stdout/stderr cannot corrupt it.

Requests are {"op": NAME, ...}; every reply is {"ok": true, ...} or {"ok": false, "error": TEXT}.
float32 arrays (logits) travel as {"f32": base64 of the little-endian bytes, "shape": [...]}, so
they arrive bit for bit.

Threading: a Channel is used by one thread at a time.
"""
from __future__ import annotations

import base64
import json
import os
import sys

import numpy as np


def encode_f32(array) -> dict:
    a = np.ascontiguousarray(np.asarray(array, dtype="<f4"))
    return {"f32": base64.b64encode(a.tobytes()).decode("ascii"), "shape": list(a.shape)}


def decode_f32(obj: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(obj["f32"]), dtype="<f4").reshape(obj["shape"])


class ChannelClosed(EOFError):
    pass


class Channel:
    """JSON lines: reads from fd `rx`, writes to fd `tx`."""

    def __init__(self, rx: int, tx: int):
        self._rx = os.fdopen(rx, "r", encoding="utf-8")
        self._tx = os.fdopen(tx, "w", encoding="utf-8")

    def send(self, obj: dict) -> None:
        self._tx.write(json.dumps(obj) + "\n")
        self._tx.flush()

    def recv(self) -> dict:
        line = self._rx.readline()
        if not line:
            raise ChannelClosed("the other side closed the channel")
        return json.loads(line)

    def call(self, op: str, **fields) -> dict:
        """Sends a request and returns its reply; RuntimeError carrying the remote error."""
        self.send(dict(op=op, **fields))
        reply = self.recv()
        if not reply.get("ok"):
            raise RuntimeError(f"{op}: {reply.get('error', reply)}")
        return reply

    def close(self) -> None:
        for f in (self._tx, self._rx):
            try:
                f.close()
            except OSError:
                pass


def serve(channel: Channel, handlers: dict) -> None:
    """Answers requests with handlers[op](request) -> dict until {"op": "quit"} or EOF. A
    handler's exception becomes an error reply (and is printed to stderr); the loop goes on."""
    while True:
        try:
            request = channel.recv()
        except ChannelClosed:
            return
        op = request.get("op")
        if op == "quit":
            channel.send({"ok": True})
            return
        try:
            if op not in handlers:
                raise KeyError(f"unknown op '{op}'")
            reply = handlers[op](request)
            channel.send(dict(reply, ok=True))
        except Exception as e:  # the driver decides what a failed request means
            import traceback

            traceback.print_exc(file=sys.stderr)
            channel.send({"ok": False, "error": f"{type(e).__name__}: {e}"})
