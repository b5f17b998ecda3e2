"""Wyoming framing with limits: the errors reported as `error` events, and a reader that refuses
an oversized event before reading its payload (the framing itself stays the `wyoming`
package's)."""

from __future__ import annotations

import asyncio


class WyomingError(Exception):
    """A problem to report as an `error` event; `close` ends the connection after it."""

    def __init__(self, text: str, code: str, *, close: bool = False) -> None:
        super().__init__(text)
        self.code = code
        self.close = close


class BoundedReader:
    """The two reads `wyoming.event.async_read_event` makes, refused above the limits before
    any byte of an oversized payload is read (the framing itself stays the package's)."""

    def __init__(self, reader: asyncio.StreamReader, max_payload: int) -> None:
        self.reader = reader
        self.max_payload = max_payload

    async def readline(self) -> bytes:
        try:
            return await self.reader.readline()
        except (asyncio.LimitOverrunError, ValueError) as e:  # a line over the reader's limit
            raise WyomingError("event header too long", "message_too_large", close=True) from e

    async def readexactly(self, n: int) -> bytes:
        if n > self.max_payload:
            raise WyomingError(
                f"event of {n} bytes is larger than the limit of {self.max_payload}",
                "message_too_large", close=True,
            )  # fmt: skip
        return await self.reader.readexactly(n)
