"""When a live turn ends with semantic turn detection (Realtime `semantic_vad`), as data.

The VAD finds candidate pauses: speech, then `CANDIDATE_SILENCE_S` of silence. At each, the turn
model (`app.engine.turn`) judges the turn so far: "finished" ends the turn there; "not finished"
holds it open, and the turn goes on when the person speaks again, or ends once the silence has
lasted the longest wait. OpenAI's `eagerness` sets that wait (low / medium or auto / high: at
most 8 / 4 / 2 s, as OpenAI documents it); the turn model's own threshold (0.5, as Pipecat uses
it) decides "finished".

`Turn` is frozen; `speech`, `pause` and `heard` are pure transitions returning the next turn and
what the session must do (`Act`). Nothing here touches audio, a model or a client: the session
runs the model and executes the act.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Eagerness = Literal["low", "medium", "high", "auto"]
EAGERNESS: tuple[str, ...] = ("low", "medium", "high", "auto")
MAX_WAIT_S: dict[str, float] = {"low": 8.0, "medium": 4.0, "auto": 4.0, "high": 2.0}
FINISHED = 0.5  # P(complete) from which the turn model's judgement ends a turn
CANDIDATE_SILENCE_S = 0.5  # silence after speech at which the turn model judges the turn (as
# server_vad's default ends one: a shorter one splits off breaths and word tails as turns of
# their own)

# start: a turn begins (its item opens); end: the turn ended where its silence began; hold: the
# words before the pause are final, the turn goes on; none: nothing to do
Act = Literal["start", "end", "hold", "none"]


@dataclass(frozen=True)
class TurnRules:
    """threshold: P(complete) from which a pause ends the turn; max_wait_s: silence after which
    a held turn ends whatever the model said."""

    threshold: float = FINISHED
    max_wait_s: float = MAX_WAIT_S["auto"]

    @classmethod
    def of(cls, eagerness: str) -> TurnRules:
        if eagerness not in MAX_WAIT_S:
            raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS)}, not {eagerness!r}")
        return cls(max_wait_s=MAX_WAIT_S[eagerness])


@dataclass(frozen=True)
class Turn:
    """open: a turn is being spoken (its item is open); held_at: stream seconds where the silence
    of a pause judged unfinished began (None: not held)."""

    open: bool = False
    held_at: float | None = None


def speech(turn: Turn) -> tuple[Turn, Act]:
    """The VAD heard speech begin: a new turn, or the held one going on."""
    if turn.open:
        return replace(turn, held_at=None), "none"
    return Turn(open=True), "start"


def pause(turn: Turn, at: float, finished: float, rules: TurnRules) -> tuple[Turn, Act]:
    """A candidate pause whose silence began at `at` (stream seconds), the turn model's
    P(complete) `finished`: the turn ends there, or is held."""
    if not turn.open:
        return turn, "none"
    if finished >= rules.threshold:
        return Turn(), "end"
    return replace(turn, held_at=at), "hold"


def heard(turn: Turn, now: float, rules: TurnRules) -> tuple[Turn, Act]:
    """The audio reached `now` (stream seconds): a held turn whose silence lasted the longest
    wait ends."""
    if turn.held_at is not None and now - turn.held_at >= rules.max_wait_s:
        return Turn(), "end"
    return turn, "none"
