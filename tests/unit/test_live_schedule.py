"""When a live stream's next pass runs (`app.service.live.schedule.PassSchedule`): numbers in,
a decision out; no audio, no model."""

from __future__ import annotations

import pytest

from app.service.live.schedule import PassSchedule

SCHEDULE = PassSchedule(step_s=1.0, min_step_s=0.5, share=0.5)


def test_a_full_step_always_runs_a_pass() -> None:
    assert SCHEDULE.due(1.0, heard_s=7.0, first_due_s=None, last_pass_s=0.3)
    assert SCHEDULE.due(1.2, heard_s=7.0, first_due_s=9.0, last_pass_s=5.0)
    assert not SCHEDULE.due(0.9, heard_s=7.0, first_due_s=None, last_pass_s=0.3)


def test_a_pass_runs_early_once_the_first_pending_word_is_due() -> None:
    """The word "what" (peak 5.6 s, edge 0.7 s) can be committed from 6.3 s of audio on: the
    pass runs then, not at the step's end (7.1 s)."""
    assert not SCHEDULE.due(0.5, heard_s=6.2, first_due_s=6.3, last_pass_s=0.25)
    assert SCHEDULE.due(0.6, heard_s=6.3, first_due_s=6.3, last_pass_s=0.25)


def test_early_passes_stay_min_step_apart() -> None:
    assert not SCHEDULE.due(0.4, heard_s=6.5, first_due_s=6.3, last_pass_s=0.1)
    assert SCHEDULE.due(0.5, heard_s=6.6, first_due_s=6.3, last_pass_s=0.1)


def test_slow_passes_keep_to_the_step() -> None:
    """A pass that took 0.4 s allows an early pass only after 0.8 s of new audio (half the
    machine's time); one that took 0.6 s never (the step comes first)."""
    assert not SCHEDULE.due(0.7, heard_s=7.0, first_due_s=6.3, last_pass_s=0.4)
    assert SCHEDULE.due(0.8, heard_s=7.0, first_due_s=6.3, last_pass_s=0.4)
    assert not SCHEDULE.due(0.99, heard_s=7.0, first_due_s=6.3, last_pass_s=0.6)


def test_share_is_validated() -> None:
    with pytest.raises(ValueError, match="share"):
        PassSchedule(share=0)
