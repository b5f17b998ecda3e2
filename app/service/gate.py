"""Whether this server takes new work: the one gate every adapter asks (REST, SSE, the Realtime
protocol, the own WebSocket, Wyoming) and `/health` reports.

    loading  --loaded()-->  ready  --drain()-->  draining  --stop()-->  stopped
       `--loaded(error)-->  failed

- loading: the start-up models are being built, loaded and warmed; nothing is served (retry).
- ready: everything is served.
- failed: the start-up models could not be loaded; nothing is served, the reason is said.
- draining: a shutdown signal came; `/health` answers 503 so a load balancer stops routing here,
  requests are still served for `STT_SHUTDOWN_DELAY_S`, new live sessions are refused (they
  would be cut off).
- stopped: the live sessions were ended and the server is closing; nothing new is served.

The state is written by the loader thread and the shutdown, read from any thread.
"""

from __future__ import annotations

import threading
from typing import Literal

from app.service.errors import Rejected

GateState = Literal["loading", "ready", "failed", "draining", "stopped"]
Work = Literal["request", "session"]  # one request (REST) | a live session (WebSockets, Wyoming)
LOADING_RETRY_S = 5


class ServerGate:
    def __init__(self) -> None:
        self.state: GateState = "loading"
        self.error: str | None = None  # why loading failed
        self._loaded = threading.Event()

    def loaded(self, error: str | None = None) -> None:
        """Loading ended: ready, or failed with `error`."""
        self.state = "failed" if error else "ready"
        self.error = error
        self._loaded.set()

    def drain(self) -> bool:
        """A shutdown signal: draining. False if the server was already draining or stopped."""
        if self.state in ("draining", "stopped"):
            return False
        self.state = "draining"
        return True

    def stop(self) -> None:
        self.state = "stopped"

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until loading ended (ready or failed); True if it did within `timeout`."""
        return self._loaded.wait(timeout)

    @property
    def serving(self) -> bool:
        """What `/health` says: ready for new work of every kind."""
        return self.state == "ready"

    def refusal(self, work: Work) -> Rejected | None:
        """Why new `work` cannot start now; None when it can."""
        match self.state:
            case "ready":
                return None
            case "draining" if work == "request":
                return None
            case "loading":
                return Rejected(
                    "loading", "The models are still loading; retry shortly",
                    kind="unavailable", retry_after_s=LOADING_RETRY_S,
                )  # fmt: skip
            case "failed":
                return Rejected(
                    "model_load_failed", f"Model loading failed: {self.error}", kind="unavailable"
                )
            case _:
                return Rejected(
                    "shutting_down", "The server is shutting down; reconnect", kind="unavailable"
                )

    def check(self, work: Work) -> None:
        """Raise the refusal of new `work`, if there is one."""
        refusal = self.refusal(work)
        if refusal is not None:
            raise refusal
