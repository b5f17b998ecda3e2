"""Semantic turn detection as data (`app.service.live.turns`): synthetic VAD events and turn
model scores, no audio."""

from __future__ import annotations

import pytest

from app.service.live.turns import MAX_WAIT_S, Turn, TurnRules, heard, pause, speech

RULES = TurnRules.of("auto")


def run(events: list[tuple], rules: TurnRules = RULES) -> list[tuple[float, str]]:
    """Feed ("speech", t) / ("pause", t, p) / ("heard", t) events; the acts, with their times."""
    turn, acts = Turn(), []
    for event in events:
        kind, t = event[0], event[1]
        if kind == "speech":
            turn, act = speech(turn)
        elif kind == "pause":
            turn, act = pause(turn, t, event[2], rules)
        else:
            turn, act = heard(turn, t, rules)
        if act != "none":
            acts.append((t, act))
    return acts


def test_a_pause_judged_finished_ends_the_turn() -> None:
    assert run([("speech", 0.0), ("pause", 2.0, 0.91), ("heard", 3.0)]) == [
        (0.0, "start"), (2.0, "end"),
    ]  # fmt: skip


def test_an_unfinished_pause_holds_the_turn_and_speech_goes_on_in_it() -> None:
    acts = run([("speech", 0.0), ("pause", 3.0, 0.1), ("heard", 4.0), ("speech", 4.1),
                ("pause", 8.0, 0.8)])  # fmt: skip
    assert acts == [(0.0, "start"), (3.0, "hold"), (8.0, "end")]  # one turn, one item


def test_a_held_turn_ends_after_the_longest_wait_of_silence() -> None:
    acts = run([("speech", 0.0), ("pause", 3.0, 0.1), ("heard", 6.9), ("heard", 7.0)])
    assert acts == [(0.0, "start"), (3.0, "hold"), (7.0, "end")]  # 4 s: eagerness auto


@pytest.mark.parametrize(("eagerness", "wait"), [("low", 8.0), ("medium", 4.0), ("high", 2.0)])
def test_eagerness_sets_the_longest_wait_as_openai_documents(eagerness: str, wait: float) -> None:
    assert MAX_WAIT_S[eagerness] == wait
    events = [("speech", 0.0), ("pause", 1.0, 0.0), ("heard", 1.0 + wait - 0.01),
              ("heard", 1.0 + wait)]  # fmt: skip
    assert run(events, TurnRules.of(eagerness))[-1] == (1.0 + wait, "end")


def test_speech_after_an_ended_turn_starts_the_next_one() -> None:
    acts = run([("speech", 0.0), ("pause", 1.0, 0.9), ("speech", 3.0), ("pause", 4.0, 0.7)])
    assert acts == [(0.0, "start"), (1.0, "end"), (3.0, "start"), (4.0, "end")]


def test_pauses_and_time_outside_a_turn_do_nothing() -> None:
    assert run([("pause", 1.0, 0.9), ("heard", 10.0)]) == []


def test_an_unknown_eagerness_is_refused() -> None:
    with pytest.raises(ValueError, match="eagerness must be one of"):
        TurnRules.of("eager")
