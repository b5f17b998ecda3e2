"""Word timestamps with the real models: words spell their segment's text, are ordered, sit
inside their segment, land where the speech is (jfk's words, a clip's known offset after
silence), and do not depend on batching, the search or the VAD's collecting."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.service.batching.records import BatchingOptions
from app.service.batching.scheduler import BatchingSessions
from app.service.transcription.transcriber import Transcriber, TranscriptionOptions
from tests.engine.conftest import EARNINGS, JFK, SPANISH, clip, seconds

WORDS = TranscriptionOptions(language="en", beam_size=1, word_timestamps=True)


def transcribe(transcriber: Transcriber, audio: np.ndarray, options=WORDS):
    segments, info = transcriber.transcribe(audio, options)
    return list(segments), info


def check_words(segments, duration: float) -> None:
    """Every segment has words that spell its text exactly, in order, inside it."""
    assert segments
    previous_end = 0.0
    for segment in segments:
        assert segment.words, segment
        assert "".join(w.word for w in segment.words) == segment.text
        assert segment.start <= segment.words[0].start
        assert segment.words[-1].end <= segment.end <= duration + 0.01
        for word in segment.words:
            assert previous_end - 1e-6 <= word.start <= word.end
            assert 0.0 <= word.probability <= 1.0
            previous_end = word.end


@pytest.mark.parametrize("beam_size", [1, 5])
def test_jfk_words_tiny(tiny_tr, beam_size):
    options = TranscriptionOptions(language="en", beam_size=beam_size, word_timestamps=True)
    segments, info = transcribe(tiny_tr, clip(JFK), options)
    check_words(segments, 11.0)
    words = [w for s in segments for w in s.words]
    # jfk.wav: "And" begins at ~0.3 s after a breath, "country" ends at ~10.4 s
    assert words[0].word.strip() == "And" and words[0].start < 0.8
    assert words[-1].word.strip(" .") == "country" and abs(words[-1].end - 10.4) < 0.5
    assert info.stats.align_s > 0


def test_jfk_words_base(base_tr):
    segments, _ = transcribe(base_tr, clip(JFK))
    check_words(segments, 11.0)


def test_words_off_by_default(tiny_tr):
    segments, info = transcribe(tiny_tr, clip(JFK), TranscriptionOptions(beam_size=1))
    assert all(s.words is None for s in segments) and info.stats.align_s == 0


def test_words_do_not_change_the_text(tiny_tr):
    audio = clip(EARNINGS)
    plain, _ = transcribe(tiny_tr, audio, TranscriptionOptions(language="en", beam_size=1))
    worded, _ = transcribe(tiny_tr, audio)
    assert [s.text for s in worded] == [s.text for s in plain]
    check_words(worded, audio.shape[0] / 16000)


def test_words_after_silence_start_at_the_speech(tiny_vad_tr):
    """jfk after 7 s of silence: with the VAD collecting speech, the words come back in the
    original audio's time, and the first one starts where the speech does."""
    audio = np.concatenate([np.zeros(seconds(7), np.float32), clip(JFK)])
    for tr_options in (WORDS, TranscriptionOptions(**{**WORDS.__dict__, "vad_filter": True})):
        segments, _ = transcribe(tiny_vad_tr, audio, tr_options)
        check_words(segments, 18.0)
        first = segments[0].words[0]
        assert 7.0 <= first.start < 7.8, (tr_options.vad_filter, first)


def test_batching_gives_the_same_words(tiny_fp16, tiny_tok):
    audio = clip(JFK)
    alone, _ = transcribe(Transcriber(tiny_fp16, tiny_tok), audio)
    scheduler = BatchingSessions(tiny_fp16, BatchingOptions(max_rows=8), name="words")
    try:
        batched, _ = transcribe(Transcriber(scheduler, tiny_tok), audio)
    finally:
        scheduler.close()
    assert [s.words for s in batched] == [s.words for s in alone]


def test_static_cache_gives_the_same_words(tiny_tr):
    audio = clip(JFK)
    concat, _ = transcribe(tiny_tr, audio)
    static, _ = transcribe(
        tiny_tr, audio, TranscriptionOptions(**{**WORDS.__dict__, "kv_cache": "static"})
    )
    pairs = [
        (a, b)
        for s, t in zip(concat, static, strict=True)
        for a, b in zip(s.words, t.words, strict=True)
    ]
    assert [a.word for a, _ in pairs] == [b.word for _, b in pairs]
    assert max(abs(a.start - b.start) for a, b in pairs) <= 0.02


def test_segments_stay_ordered(tiny_tr):
    segments, _ = transcribe(tiny_tr, clip(EARNINGS))
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(segments))


def test_multilingual_words(base_tr):
    """base on the Spanish clip, language detected: words spell each segment's text."""
    audio = clip(SPANISH)
    segments, info = transcribe(
        base_tr, audio, TranscriptionOptions(beam_size=5, word_timestamps=True)
    )
    assert info.language == "es"
    check_words(segments, audio.shape[0] / 16000)
    assert "arenas" in " ".join(w.word.lower() for s in segments for w in s.words)
