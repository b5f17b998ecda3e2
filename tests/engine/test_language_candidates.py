"""Language detection restricted to candidates (OpenAI's `languages[]`), on base."""

from __future__ import annotations

import pytest

from app.engine.language_detection import detect_language
from tests.engine.conftest import JFK, clip, window_cross


def test_detection_picks_the_likeliest_candidate(base, base_tok) -> None:
    cross = window_cross(base, clip(JFK))
    everything = detect_language(base, cross, base_tok)
    assert everything.language == "en"
    detection = detect_language(base, cross, base_tok, candidates=("de", "fr"))
    likelier = max(("de", "fr"), key=lambda code: everything.probabilities[code])
    assert detection.language == likelier
    assert set(detection.probabilities) == {"de", "fr"}
    assert abs(sum(detection.probabilities.values()) - 1.0) < 1e-6


def test_a_candidate_the_model_does_not_know_is_an_error(base, base_tok) -> None:
    cross = window_cross(base, clip(JFK))
    with pytest.raises(ValueError, match="not supported by this model"):  # yue: large-v3 only
        detect_language(base, cross, base_tok, candidates=("yue",))
