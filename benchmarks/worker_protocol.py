"""The JSON-lines protocol of the benchmark worker processes (`our_worker.py` in `.venv`,
`peer_worker.py` in `.venv-peer`). Standard library only, so the peer's venv can import it.

One JSON object per line on stdin, `{"op": NAME, ...arguments}`; one JSON line answers each on
stdout: the handler's dict, or `{"error": "..."}`. `rss` and `quit` are built in.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


def rss() -> dict:
    """This process's current and peak resident memory, MB (VmRSS / VmHWM)."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            values[key] = int(value.split()[0]) / 1024
    return {"rss_mb": values["VmRSS"], "peak_rss_mb": values["VmHWM"]}


def serve(handlers: dict[str, Callable[..., dict]]) -> None:
    """Answer requests until `quit` or the end of stdin; `handlers[op](**arguments)` -> reply.
    Anything libraries print goes to stderr, off the protocol; a failing request is reported to
    the driver and the worker keeps serving."""
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "quit":
                reply: dict = {"ok": True}
            elif op == "rss":
                reply = rss()
            elif op in handlers:
                reply = handlers[op](**request)
            else:
                reply = {"error": f"unknown op {op}"}
        except Exception as e:
            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if op == "quit":
            break
