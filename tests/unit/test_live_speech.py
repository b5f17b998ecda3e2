"""What admission knows of a live stream's speech, as data (`app.service.live.speech`):
synthetic VAD events and turn model scores on a buffer's span, no audio, no model."""

from __future__ import annotations

from dataclasses import replace

from app.service.live.events import Finalized, SpeechStarted, SpeechStopped
from app.service.live.options import StreamingOptions
from app.service.live.speech import (
    Buffer,
    DropBefore,
    ForgetContext,
    Rules,
    Speech,
    Tell,
    admitted,
    decode_due,
    flushed,
    heard,
    needs_judgement,
    restarted,
)
from app.service.live.turns import TurnRules

SR = 16000
RULES = Rules.of(StreamingOptions())  # step 1 s, preroll 0.3 s, pad 0.2 s, min speech 0.25 s
SEMANTIC = replace(RULES, turn=TurnRules.of("high"))  # the longest wait: 2 s


def s(seconds: float) -> int:
    return round(seconds * SR)


def buf(start: float, end: float, **words: bool) -> Buffer:
    return Buffer(s(start), s(end), **words)


def told(acts: tuple) -> list:
    return [a.event for a in acts if isinstance(a, Tell)]


def test_speech_opens_the_utterance_and_the_first_pass_is_due_a_step_after_it_began() -> None:
    state, acts = heard(Speech(), "start", s(2.0), buf(0.0, 2.25), RULES, None)
    assert told(acts) == [SpeechStarted(2.0)]
    assert DropBefore(s(1.7)) in acts  # nothing worth keeping: the silence before the preroll
    assert state.open and state.start == s(2.0) and state.decoded_until == s(1.7)
    assert not decode_due(state, buf(1.7, 2.6), RULES, tail_due=False)
    assert decode_due(state, buf(1.7, 2.7), RULES, tail_due=False)
    assert not decode_due(state, buf(1.7, 2.7), RULES, tail_due=True)  # the last word's tail


def test_speech_after_words_worth_keeping_keeps_the_audio_before_it() -> None:
    _, acts = heard(Speech(), "start", s(5.0), buf(0.0, 5.25, holds_words=True), RULES, None)
    assert told(acts) == [SpeechStarted(5.0)] and not any(isinstance(a, DropBefore) for a in acts)


def test_the_vads_end_ends_the_turn_and_finalizes_its_words_with_the_pad() -> None:
    state, _ = heard(Speech(), "start", s(1.0), buf(0.0, 1.25), RULES, None)
    assert not needs_judgement(state, "end", RULES)
    state, acts = heard(state, "end", s(3.0), buf(0.7, 3.5), RULES, None)
    assert told(acts) == [SpeechStopped(3.0)]  # its Finalized comes once the pass is done
    assert not state.open and state.end == s(3.0)
    assert (state.final_until, state.final_reason) == (s(3.2), "pause")
    assert decode_due(state, buf(0.7, 3.5), RULES, tail_due=False)


def test_speech_shorter_than_min_speech_is_no_turn() -> None:
    state, _ = heard(Speech(), "start", s(1.0), buf(0.0, 1.25), RULES, None)
    state, acts = heard(state, "end", s(1.2), buf(0.7, 1.75), RULES, None)
    assert told(acts) == [SpeechStopped(1.2), Finalized("pause", 1.2)]
    assert state.final_until is None and not state.open
    # unless words of it are pending: then they are finalized
    state, _ = heard(Speech(), "start", s(1.0), buf(0.0, 1.25), RULES, None)
    state, acts = heard(state, "end", s(1.2), buf(0.7, 1.75, pending=True), RULES, None)
    assert told(acts) == [SpeechStopped(1.2)] and state.final_until == s(1.4)


def test_a_pause_inside_speech_finalizes_the_words_before_it_and_the_turn_goes_on() -> None:
    state, _ = heard(Speech(), "start", s(1.0), buf(0.0, 1.25), RULES, None)
    state, acts = heard(state, "pause", s(2.5), buf(0.7, 2.75), RULES, None)
    assert acts == () and state.open
    assert (state.final_until, state.final_reason) == (s(2.7), None)
    # the turn's end before that finalization was done takes it over
    state, acts = heard(state, "end", s(2.5), buf(0.7, 3.0), RULES, None)
    assert told(acts) == [SpeechStopped(2.5)]
    assert (state.final_until, state.final_reason) == (s(2.7), "pause")


def test_a_pause_right_after_speech_began_is_not_a_finalization() -> None:
    state, _ = heard(Speech(), "start", s(1.0), buf(0.0, 1.25), RULES, None)
    state, acts = heard(state, "pause", s(1.1), buf(0.7, 1.5), RULES, None)
    assert (state.final_until, acts) == (None, ())


def test_semantic_turns_hold_an_unfinished_pause_until_the_longest_wait() -> None:
    state, _ = heard(Speech(), "start", s(1.0), buf(0.0, 1.25), SEMANTIC, None)
    assert needs_judgement(state, "end", SEMANTIC) and not needs_judgement(state, "pause", SEMANTIC)
    state, acts = heard(state, "end", s(3.0), buf(0.7, 3.5), SEMANTIC, finished=0.2)
    assert acts == () and state.open  # held: the words before it are finalized, no turn end
    assert (state.final_until, state.final_reason) == (s(3.2), None)
    state = replace(state, final_until=None)  # that finalization was done
    state, acts = admitted(state, buf(0.7, 4.99), SEMANTIC)
    assert acts == () and state.open
    state, acts = admitted(state, buf(0.7, 5.0), SEMANTIC)  # 2 s of silence after 3.0
    assert told(acts) == [SpeechStopped(3.0)] and not state.open
    assert (state.final_until, state.final_reason) == (s(3.2), "pause")


def test_semantic_turns_end_at_a_pause_judged_finished_and_speech_resumes_a_held_one() -> None:
    state, _ = heard(Speech(), "start", s(1.0), buf(0.0, 1.25), SEMANTIC, None)
    held, _ = heard(state, "end", s(3.0), buf(0.7, 3.5), SEMANTIC, finished=0.2)
    resumed, acts = heard(replace(held, final_until=None), "start", s(3.9), buf(0.7, 4.0),
                          SEMANTIC, None)  # fmt: skip
    assert acts == () and resumed.open and resumed.turn.held_at is None  # the same item
    state, acts = heard(resumed, "end", s(6.0), buf(0.7, 6.5), SEMANTIC, finished=0.9)
    assert told(acts) == [SpeechStopped(6.0)] and state.final_reason == "pause"


def test_a_long_silence_drops_the_context_but_the_preroll() -> None:
    state = Speech(end=s(2.0), decoded_until=s(2.0))
    kept, acts = admitted(state, buf(0.0, 4.9, holds_words=True), RULES)
    assert acts == () and kept == state  # 2.9 s of silence: the words stay as context
    dropped, acts = admitted(state, buf(0.0, 5.1, holds_words=True), RULES)
    assert acts == (DropBefore(s(4.8)), ForgetContext())
    assert dropped.decoded_until == s(4.8)
    _, acts = admitted(state, buf(0.0, 2.5), RULES)  # nothing worth keeping: at once
    assert acts == (DropBefore(s(2.2)), ForgetContext())
    assert admitted(replace(state, open=True), buf(0.0, 9.0), RULES)[1] == ()  # speech goes on


def test_a_client_commit_finalizes_what_was_sent_or_says_it_is_final() -> None:
    state, acts = flushed(Speech(), buf(0.0, 3.0))
    assert state.final_until is None and told(acts) == [Finalized("flush", 3.0)]
    opened = Speech(open=True, start=s(1.0))
    state, acts = flushed(opened, buf(0.5, 3.0))
    assert acts == () and (state.final_until, state.final_reason) == (s(3.0), "flush")


def test_a_clear_restarts_the_utterance_where_the_stream_goes_on() -> None:
    state = Speech(open=True, start=s(1.0), final_until=s(2.0), decoded_until=s(1.5))
    cleared = restarted(state, s(4.0), vad=True)
    assert (cleared.open, cleared.final_until, cleared.decoded_until) == (False, None, s(4.0))
    without_vad = restarted(Speech.without_vad(), s(4.0), vad=False)
    assert without_vad.open and without_vad.decoded_until == s(4.0)
