"""A decoded window judged to hold no speech writes nothing
(`app.service.transcription.windows.judged_silent`): Whisper's no-speech rule, and a text too
long for the window's audio."""

from __future__ import annotations

import numpy as np
import pytest

from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.transcriber import Transcriber
from app.service.transcription.windows import judged_silent
from tests.engine.conftest import EARNINGS, clip, normalise
from tests.media import at_snr, coloured

REPEAT = "The results are pretty good as you can see."


def test_whispers_rule_and_the_speaking_rate() -> None:
    # Whisper's rule: probably silent and not confident
    assert judged_silent(0.9, -1.2, " Thank you.", 30.0, 0.6, -1.0)
    assert not judged_silent(0.9, -0.5, " Thank you.", 30.0, 0.6, -1.0)  # confident: speech
    assert not judged_silent(0.3, -1.5, " Thank you.", 30.0, 0.6, -1.0)  # probably speech
    # measured: base over the last 0.28 s of the noisy 60 s clip, an earlier sentence again
    assert judged_silent(0.92, -0.82, " " + REPEAT, 0.28, 0.6, -1.0)
    assert not judged_silent(0.92, -0.82, " " + REPEAT, 3.0, 0.6, -1.0)  # could be said in 3 s
    assert not judged_silent(0.92, -0.82, " euros.", 0.28, 0.6, -1.0)  # a word fits in 0.28 s
    assert not judged_silent(0.3, -0.82, " " + REPEAT, 0.28, 0.6, -1.0)  # probably speech
    assert not judged_silent(0.99, -3.0, " " + REPEAT, 0.28, None, -1.0)  # check turned off


@pytest.mark.parametrize("seed", [0, 2])
def test_noisy_clip_ends_where_its_speech_ends(base_vad_tr: Transcriber, seed: int) -> None:
    """The 60 s clip in pink noise (SNR 10 dB), base, the service's defaults (VAD, beam 5): the
    last window holds 0.28 s of noise, and Whisper wrote over it "It's always nice." (seed 0)
    or an earlier sentence again, its prompt (seed 2)."""
    speech = clip(EARNINGS).astype(np.float64)
    noisy = at_snr(speech, coloured(np.random.default_rng(seed), speech.shape[0], 1.0), 10)
    options = TranscriptionOptions(language="en", vad_filter=True)
    segments, _ = base_vad_tr.transcribe(noisy.astype(np.float32), options)
    text = normalise("".join(s.text for s in segments))
    assert text.endswith("17 billion euros"), text
    assert text.count(normalise(REPEAT)) == 1, text
