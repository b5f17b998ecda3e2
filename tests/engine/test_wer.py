"""Word errors against faster-whisper with the same weights: greedy on the devcorpus (3,992
words), ours no worse than faster-whisper's by more than the paired noise (`devcorpus`); beam 5
over the English testdata clips (corpus WER, 9 clips) within 1 point, and at least as good as
greedy there.

Normalisation: Whisper's English text normaliser (transformers' port of openai/whisper's
`EnglishTextNormalizer`) without the British->American spelling table, on the references and
the hypotheses alike.

The peer's figures below were measured on this machine with faster-whisper 1.x (CTranslate2,
2 threads, default options, language "en") on the same CTranslate2 weights and this same
normalisation. FACTS.md / issue 3 quote 2.39 / 1.99 / 1.20 / 1.59 %: those used the full
normaliser, whose spelling table also maps "counselled" -> "counseled" (one word of 251 = 0.4
point lower everywhere). With fp32 weights faster-whisper gives exactly our numbers
(tiny.en 2.79 / 2.39, base 2.39 / 2.39); with int8 it gets one more word right on base greedy.
"""

from __future__ import annotations

import jiwer
import pytest
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from app.service.transcription.transcriber import Transcriber, TranscriptionOptions
from tests.engine import devcorpus
from tests.engine.conftest import ENGLISH_CLIPS, REFERENCES, clip

# `make test-cpus` reads these words under each arithmetic the machine can emulate (cpu_lanes);
# base's pass over the devcorpus on the machine's own kind only (`make test`): the lanes' budget
PER_ARITHMETIC = [pytest.mark.cpu_kind, pytest.mark.per_arithmetic]

# faster-whisper int8 (its usual CPU setting), same clips, same normalisation, in percent; its
# greedy figures were tiny.en 2.79, base 1.59 (greedy is judged on the devcorpus instead)
PEER_WER = {
    ("tiny.en", 5): 2.39,
    ("base", 5): 2.39,
}
MARGIN = 1.0  # percentage points
_normaliser = EnglishTextNormalizer({})
_wer: dict[tuple[str, int], float] = {}


def corpus_wer(transcriber: Transcriber, model: str, beam_size: int) -> float:
    if (model, beam_size) not in _wer:
        refs, hyps = [], []
        options = TranscriptionOptions(beam_size=beam_size, language="en")
        for name in ENGLISH_CLIPS:
            segments, _ = transcriber.transcribe(clip(name), options)
            hyps.append(_normaliser("".join(s.text for s in segments)))
            refs.append(_normaliser(REFERENCES[name]))
        _wer[model, beam_size] = 100.0 * jiwer.wer(refs, hyps)
    return _wer[model, beam_size]


@pytest.fixture
def transcribers(tiny_tr, base_tr) -> dict[str, Transcriber]:
    return {"tiny.en": tiny_tr, "base": base_tr}


@pytest.mark.parametrize("model", [pytest.param("tiny.en", marks=PER_ARITHMETIC), "base"])
def test_greedy_errors_within_the_paired_noise_of_faster_whisper(model, transcribers):
    result = devcorpus.paired(
        devcorpus.peer_texts(model), devcorpus.transcripts(transcribers[model], 1)
    )
    print(f"{model} greedy against faster-whisper int8: {result}")
    assert result.extra <= result.noise, str(result)


@pytest.mark.cpu_kind
@pytest.mark.per_arithmetic
@pytest.mark.parametrize(("model", "beam_size"), list(PEER_WER))
def test_beam_wer_within_a_point_of_faster_whisper(model, beam_size, transcribers):
    wer = corpus_wer(transcribers[model], model, beam_size)
    peer = PEER_WER[model, beam_size]
    print(f"WER {model} beam {beam_size}: {wer:.2f} % (faster-whisper {peer:.2f} %)")
    assert wer <= peer + MARGIN


@pytest.mark.cpu_kind
@pytest.mark.per_arithmetic
@pytest.mark.parametrize("model", ["tiny.en", "base"])
def test_beam_is_at_least_as_good_as_greedy(model, transcribers):
    greedy = corpus_wer(transcribers[model], model, 1)
    beam = corpus_wer(transcribers[model], model, 5)
    assert beam <= greedy
