"""Word errors on the devcorpus, judged by their paired noise.

`benchmarks/data/devcorpus/`: 162 LibriSpeech utterances, 18 speakers, 3,992 words (its README
says where they come from). A difference of word errors between two systems on the same clips is
judged against its paired noise: the per-clip differences' signs flipped at random; a net change
inside 2 sd of those totals is noise. On the repo's 9 English clips (251 words) a CPU kind's own
kernels move a near-tie word or three (the AVX-512 BF16 EPYC: tiny.en greedy 11 errors where the
AMX Xeon makes 7), which no fixed margin on so few words can tell from a loss.

Texts of faster-whisper int8 on the same weights (greedy, English), for comparison, are in
`tests/data/peer/` (`benchmarks/wer_paired.py transcribe --system fw-int8`); those of the exact
computation (fp16 files computing f32, nothing quantized) in `tests/data/exact/`, written once
(on the AMX Xeon) by

    STT_DEVICE=CPU STT_PRECISION=f32 STT_ACTIVATION_QUANTIZATION=off \
        .venv/bin/python -m benchmarks.wer_paired transcribe --model tiny.en \
        --models-dir .cache/test-models-fp16 --out tests/data/exact/tiny.en-greedy.json

f32 reads the same words on every CPU kind but for a near-tie or two (well inside the paired
noise), so one pass stands for every kind and a test run need not repeat it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

import jiwer
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from app.engine.audio import decode_audio
from app.service.batching.scheduler import BatchingSessions
from app.service.transcription.transcriber import Transcriber, TranscriptionOptions
from benchmarks import wer_paired
from tests.conftest import REPO

CORPUS = wer_paired.CORPUS
PEERS = REPO / "tests" / "data" / "peer"
EXACT = REPO / "tests" / "data" / "exact"
_normaliser = EnglishTextNormalizer({})


@cache
def entries() -> tuple[dict, ...]:
    return tuple(wer_paired.entries(CORPUS))


_transcripts: dict[tuple[int, int], dict[str, str]] = {}


def transcripts(transcriber: Transcriber, beam_size: int) -> dict[str, str]:
    """Each clip's text (English, the service's other defaults), by its manifest `file`; once
    per model sessions and beam in a test run (the sessions are session fixtures). The clips are
    transcribed as the server does under load: all at once through its batching scheduler (one
    decoder call per step for every clip decoding; half the time of one clip after another)."""
    key = (id(transcriber.sessions), beam_size)
    if key not in _transcripts:
        options = TranscriptionOptions(beam_size=beam_size, language="en")
        scheduler = BatchingSessions(transcriber.sessions, name="devcorpus")
        batched = Transcriber(scheduler, transcriber.tokenizer)
        try:
            running = {
                entry["file"]: scheduler.start(
                    batched.transcription(decode_audio(CORPUS / entry["file"]), options)
                )
                for entry in entries()
            }
            texts = {
                file: " ".join(s.text.strip() for s in future.result()[0])
                for file, future in running.items()
            }
        finally:
            scheduler.close()
        _transcripts[key] = texts
    return _transcripts[key]


def peer_texts(model: str) -> dict[str, str]:
    """faster-whisper int8's greedy texts of the corpus on `model`'s weights."""
    return json.loads((PEERS / f"fw-int8-{model}-greedy.json").read_text())["texts"]


def exact_texts(model: str) -> dict[str, str]:
    """The exact computation's greedy texts of the corpus on `model` (see the module doc)."""
    return json.loads((EXACT / f"{model}-greedy.json").read_text())["texts"]


def clip_errors(reference: str, hypothesis: str) -> int:
    out = jiwer.process_words(_normaliser(reference), _normaliser(hypothesis) or "<empty>")
    return out.substitutions + out.deletions + out.insertions


@dataclass(frozen=True)
class Paired:
    """Word errors of `texts` against `baseline`'s on the corpus: `extra` (net, negative when
    fewer), `noise` (2 sd of the sign-flipped totals), both in errors; `words` in the corpus."""

    extra: int
    noise: float
    words: int
    baseline_wer: float
    wer: float

    def __str__(self) -> str:
        return (
            f"WER {self.baseline_wer:.2f} % -> {self.wer:.2f} % ({self.words} words): "
            f"{self.extra:+d} errors, paired noise ±{self.noise:.1f}"
        )


def paired(baseline: dict[str, str], texts: dict[str, str]) -> Paired:
    diffs, totals, words = [], [0, 0], 0
    for entry in entries():
        reference = entry["text"]
        before = clip_errors(reference, baseline[entry["file"]])
        after = clip_errors(reference, texts[entry["file"]])
        diffs.append(after - before)
        totals[0] += before
        totals[1] += after
        words += len(_normaliser(reference).split())
    _, sd = wer_paired.sign_flip(diffs)
    noise = 2 * sd
    return Paired(
        totals[1] - totals[0], noise, words, 100 * totals[0] / words, 100 * totals[1] / words
    )
