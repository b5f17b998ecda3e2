"""The turn model (`app.engine.turn`, Smart Turn v3.2) on real speech: a sentence cut at a
mid-sentence pause is unfinished, the whole sentence finished; its input as the model was
trained on (the last 8 s, zeros in front)."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.audio import decode_audio
from app.engine.turn import TURN_FILE, TurnModel, TurnModelError, turn_features
from tests.conftest import AUDIO, MODELS_DIR

RATE = 16_000


@pytest.fixture(scope="module")
def model() -> TurnModel:
    return TurnModel.load(MODELS_DIR / TURN_FILE)


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return decode_audio(AUDIO / "jfk.wav")


def upto(audio: np.ndarray, seconds: float, silence_s: float = 0.5) -> np.ndarray:
    return np.concatenate([audio[: round(seconds * RATE)], np.zeros(round(silence_s * RATE))])


@pytest.mark.parametrize(
    ("seconds", "finished"),
    [(4.42, False), (7.70, False), (10.6, True)],
    ids=["ask-not", "for-you", "the-end"],
)
def test_a_sentence_is_finished_only_at_its_end(
    model: TurnModel, jfk: np.ndarray, seconds: float, finished: bool
) -> None:
    """jfk: "...ask not [pause] what your country can do for you, [pause] ask what you can do
    for your country." (P(finished) 0.05, 0.06, 0.9 measured)."""
    assert (model.probability(upto(jfk, seconds)) >= 0.5) is finished


def test_the_features_are_the_last_8_s_with_zeros_in_front(jfk: np.ndarray) -> None:
    short = turn_features(jfk[: 2 * RATE])
    assert short.shape == (80, 800) and short.dtype == np.float32
    assert np.ptp(short[:, :500]) == 0.0  # the 6 s of zeros in front: one floor value
    long = np.concatenate([np.random.default_rng(0).standard_normal(5 * RATE), jfk])
    np.testing.assert_array_equal(turn_features(long), turn_features(long[-8 * RATE :]))


def test_a_missing_model_file_says_how_to_get_it(tmp_path) -> None:
    with pytest.raises(TurnModelError, match="make models"):
        TurnModel.load(tmp_path / TURN_FILE)
