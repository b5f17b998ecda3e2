"""Wyoming framing with limits: a reader that refuses an oversized event before reading its
payload (the framing itself stays the `wyoming` package's), and a close that lets the client
read the last event."""

from __future__ import annotations

import asyncio

from app.service.errors import Rejected


class BoundedReader:
    """The two reads `wyoming.event.async_read_event` makes, refused above the limits before
    any byte of an oversized payload is read (`Rejected` "message_too_large")."""

    def __init__(self, reader: asyncio.StreamReader, max_payload: int) -> None:
        self.reader = reader
        self.max_payload = max_payload

    async def readline(self) -> bytes:
        try:
            return await self.reader.readline()
        except (asyncio.LimitOverrunError, ValueError) as e:  # a line over the reader's limit
            raise Rejected("message_too_large", "event header too long", kind="limit") from e

    async def readexactly(self, n: int) -> bytes:
        if n > self.max_payload:
            raise Rejected(
                "message_too_large",
                f"event of {n} bytes is larger than the limit of {self.max_payload}",
                kind="limit",
            )
        return await self.reader.readexactly(n)


LINGER_S = 2.0  # at most this long, the bytes a client still sends are read and dropped at close


async def close_gently(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """End a connection whose client may still be sending (an oversized event's payload, audio
    after an error): half-close, so the client reads our last event and then the end of the
    stream, and drop what it still sends for up to `LINGER_S`. Closing with its bytes unread
    would make the kernel reset the connection, and a reset can discard our last event (the
    error that says why) before the client reads it."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while await reader.read(1 << 16):
                pass
    except (OSError, RuntimeError):  # the linger's end (TimeoutError), a reset, a closed loop
        pass
    finally:
        writer.close()
