"""What admission knows of a live stream's speech, as data: the VAD's events in, what the session
must do out.

`Speech` is frozen (absolute samples of the stream): whether an utterance is open, where its
speech began and the last one ended, the finalization due (up to where, and whether it ends the
turn), how far the last pass decoded, and semantic turn detection's `Turn`. The transitions are
pure: each takes the state and a `Buffer` (what the session's buffer and commits look like now)
and returns the next state with the `Act`s the session executes in order (tell the client,
drop audio before a sample, forget the committed context) before it hands over the next event.
Nothing here touches audio, a model or a client: the session runs the turn model where
`needs_judgement` says so and passes its score in.

    event "start"  -> the utterance opens (SpeechStarted; silence before the preroll dropped when
                      nothing is worth keeping); the next pass is due `step` after it began
    event "pause"  -> (a short silence inside speech) the words before it are finalized, the
                      turn goes on
    event "end"    -> the turn ends there (SpeechStopped, then a finalization that ends it), or,
                      with semantic turn detection and the turn model's "not finished", is held:
                      the words before it are finalized and the turn goes on
    `admitted`     -> after each admitted slice: a held turn past its longest wait ends; a long
                      enough silence outside speech drops the context but the preroll
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from app.runtime.contract import SAMPLE_RATE
from app.service.live import turns
from app.service.live.events import Finalized, SpeechStarted, SpeechStopped
from app.service.live.options import StreamingOptions

FinalReason = Literal["pause", "flush"] | None  # why a finalization ends a turn; None: it does not


@dataclass(frozen=True)
class Rules:
    """The session's options admission decides by, in samples."""

    min_speech: int  # shorter speech is not a turn (VadOptions.min_speech_s)
    pad: int  # audio after the VAD's end of speech that still belongs to it (speech_pad_s)
    preroll: int  # audio kept before detected speech
    context_gap: int  # a silence this long outside speech drops the context
    step: int  # new audio between two passes
    turn: turns.TurnRules | None  # semantic turn detection

    @classmethod
    def of(cls, options: StreamingOptions) -> Rules:
        vad = options.vad

        def samples(seconds: float) -> int:
            return round(seconds * SAMPLE_RATE)

        return cls(
            min_speech=samples(vad.min_speech_s) if vad else 0,
            pad=samples(vad.speech_pad_s) if vad else 0,
            preroll=samples(options.preroll_s),
            context_gap=samples(options.context_gap_s),
            step=samples(options.step_s),
            turn=options.turn,
        )


@dataclass(frozen=True)
class Buffer:
    """What the session's buffer and commits look like now: its audio spans [start, end);
    holds_words: committed context or pending words worth keeping; pending: words a pass read
    that are not committed yet."""

    start: int
    end: int
    holds_words: bool = False
    pending: bool = False


@dataclass(frozen=True)
class Speech:
    """open: an utterance is being buffered; start: where its speech began; end: where the last
    one's speech ended; final_until: finalize the buffer up to here at the next pass (None: no
    finalization due), final_reason: what it ends ("pause": the turn, "flush": a client's
    commit, None: nothing, a pause inside the turn); decoded_until: the end of the audio the
    last pass covered; turn: semantic turn detection's state."""

    open: bool = False
    start: int = 0
    end: int = 0
    final_until: int | None = None
    final_reason: FinalReason = "pause"
    decoded_until: int = 0
    turn: turns.Turn = field(default_factory=turns.Turn)

    @classmethod
    def without_vad(cls) -> Speech:
        """Without a VAD every sample is speech: the utterance is open from the start."""
        return cls(open=True)


@dataclass(frozen=True)
class Tell:
    """Send this event to the client."""

    event: SpeechStarted | SpeechStopped | Finalized


@dataclass(frozen=True)
class DropBefore:
    """Forget the buffer's audio before this absolute sample."""

    sample: int


@dataclass(frozen=True)
class ForgetContext:
    """The buffer's committed words are no longer context (commits.forget)."""


Act = Tell | DropBefore | ForgetContext
Acts = tuple[Act, ...]


def nothing_to_keep(state: Speech, buf: Buffer) -> bool:
    """The buffer holds no words (committed context or pending) worth keeping."""
    return not buf.holds_words and state.final_until is None


def request_final(
    state: Speech, until: int, reason: FinalReason, buf: Buffer, *, speech: bool
) -> tuple[Speech, bool]:
    """Finalize the buffer up to `until` at the next pass (if it may hold words); False when
    there is nothing to finalize. A turn's end (`reason`) that comes before a pause's
    finalization (None) was done takes it over."""
    if state.final_until is not None:
        if reason is not None and state.final_reason is None:
            until = max(state.final_until, until)
            return replace(state, final_until=until, final_reason=reason), True
        return state, True
    if (speech and until > buf.start) or buf.pending:
        return replace(state, final_until=max(until, buf.start), final_reason=reason), True
    return state, False


def needs_judgement(state: Speech, kind: str, rules: Rules) -> bool:
    """The turn model must judge the turn so far: an open turn's speech went silent, with
    semantic turn detection."""
    return kind == "end" and state.open and rules.turn is not None


def heard(
    state: Speech, kind: str, sample: int, buf: Buffer, rules: Rules, finished: float | None
) -> tuple[Speech, Acts]:
    """The VAD's event `kind` ("start", "pause", "end"; "resume" changes nothing here) decided
    at absolute `sample`; `finished`: the turn model's P(complete) where `needs_judgement`."""
    if kind == "start":
        return _speech_began(state, sample, buf, rules)
    if not state.open or kind not in ("pause", "end"):
        return state, ()
    if kind == "end":
        if rules.turn is not None:
            assert finished is not None, "needs_judgement: the turn model's score"
            turn, act = turns.pause(state.turn, sample / SAMPLE_RATE, finished, rules.turn)
            state = replace(state, turn=turn)
            if act != "end":  # held: the words before the pause are made final, the turn goes on
                until = min(sample + rules.pad, buf.end)
                return request_final(state, until, None, buf, speech=True)[0], ()
        return end_turn(state, sample, buf, rules)
    if sample - state.start >= rules.min_speech or buf.pending:  # a pause inside the speech
        return request_final(state, min(sample + rules.pad, buf.end), None, buf, speech=True)[0], ()
    return state, ()


def _speech_began(state: Speech, sample: int, buf: Buffer, rules: Rules) -> tuple[Speech, Acts]:
    if rules.turn is not None:
        state = replace(state, turn=turns.speech(state.turn)[0])  # a held turn goes on
    if state.open:
        return state, ()
    acts: list[Act] = [Tell(SpeechStarted(round(sample / SAMPLE_RATE, 3)))]
    start = buf.start
    if nothing_to_keep(state, buf):  # drop the silence before the preroll
        acts.append(DropBefore(sample - rules.preroll))
        start = min(max(sample - rules.preroll, buf.start), buf.end)
    # the next pass is due `step` after the speech began, not after the pause
    onset = min(max(sample - rules.preroll, start), buf.end)
    decoded = max(state.decoded_until, onset)
    return replace(state, open=True, start=sample, decoded_until=decoded), tuple(acts)


def end_turn(state: Speech, sample: int, buf: Buffer, rules: Rules) -> tuple[Speech, Acts]:
    """The turn's speech ended at absolute `sample`: SpeechStopped, and its finalization (or,
    with nothing to finalize, the word that it is final)."""
    state = replace(state, open=False, end=sample)
    acts: list[Act] = [Tell(SpeechStopped(round(sample / SAMPLE_RATE, 3)))]
    nothing = Tell(Finalized("pause", sample / SAMPLE_RATE))
    if sample - state.start < rules.min_speech and not buf.pending:
        return state, (*acts, nothing)  # too short for a turn
    state, due = request_final(state, min(sample + rules.pad, buf.end), "pause", buf, speech=True)
    return state, tuple(acts) if due else (*acts, nothing)


def admitted(state: Speech, buf: Buffer, rules: Rules) -> tuple[Speech, Acts]:
    """A slice was admitted up to `buf.end`: a held turn whose silence lasted the longest wait
    ends; outside speech, with nothing to keep or after `context_gap` of silence, the context
    goes but the preroll."""
    acts: Acts = ()
    held_at = state.turn.held_at
    if rules.turn is not None and held_at is not None:
        turn, act = turns.heard(state.turn, buf.end / SAMPLE_RATE, rules.turn)
        state = replace(state, turn=turn)
        if act == "end":  # the silence lasted the longest wait
            state, acts = end_turn(state, round(held_at * SAMPLE_RATE), buf, rules)
    if state.open or state.final_until is not None:
        return state, acts
    gap = buf.end - max(state.end, buf.start)
    if not nothing_to_keep(state, buf) and gap <= rules.context_gap:
        return state, acts
    kept_from = buf.end - rules.preroll
    decoded = max(state.decoded_until, min(max(kept_from, buf.start), buf.end))
    return replace(state, decoded_until=decoded), (*acts, DropBefore(kept_from), ForgetContext())


def flushed(state: Speech, buf: Buffer) -> tuple[Speech, Acts]:
    """A client's commit reached `buf.end`: everything before it is finalized (or, with
    nothing to finalize, the word that it is final)."""
    state, due = request_final(state, buf.end, "flush", buf, speech=state.open)
    return state, () if due else (Tell(Finalized("flush", buf.end / SAMPLE_RATE)),)


def decode_due(state: Speech, buf: Buffer, rules: Rules, tail_due: bool) -> bool:
    """A pass has work: a finalization, or `step` of new audio in an open utterance (unless
    the tail of the last word is still coming: `tail_due`)."""
    if state.final_until is not None:
        return True
    if not state.open:
        return False
    return buf.end - max(state.decoded_until, buf.start) >= rules.step and not tail_due


def restarted(state: Speech, sample: int, *, vad: bool) -> Speech:
    """After a client's clear the stream goes on at absolute `sample`: nothing is due, and
    with a VAD the utterance and the turn start afresh."""
    state = replace(state, final_until=None, decoded_until=sample)
    return replace(state, open=False, turn=turns.Turn()) if vad else state
