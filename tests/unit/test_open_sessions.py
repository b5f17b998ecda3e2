"""How many live sessions are open, which the shutdown waits on
(`app.api.services.LiveSessions`)."""

from __future__ import annotations

import asyncio

from app.api.services import LiveSessions


def test_none_returns_when_the_last_session_closes() -> None:
    async def scenario() -> None:
        sessions = LiveSessions()
        await asyncio.wait_for(sessions.none(), 1)  # none open
        with sessions, sessions:
            assert sessions.count == 2
            waiting = asyncio.ensure_future(sessions.none())
            await asyncio.sleep(0)
            assert not waiting.done()
        assert sessions.count == 0
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())
