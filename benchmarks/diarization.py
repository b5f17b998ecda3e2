"""Diarization error rate and time of the speaker pipeline on seeded conversations.

Conversations are built from real speech (`tests/data/diarization`: 6 LibriSpeech speakers, 3
utterances each): 2-4 speakers take turns, utterance after utterance, with pauses of 0.2-1.2 s or,
for half of the turns, the next speaker starting 1.5-3 s before the previous one stops
(overlapped speech). The reference says who talks when at 10 ms: each utterance's speech as
Silero VAD finds it (LibriSpeech clips have quiet edges), placed where it was mixed in.

DER is scored as pyannote reports it: no collar, overlapped speech scored, (missed + false alarm +
confusion) / reference speech, with the best one-to-one mapping of found speakers to reference
speakers. Run: `python benchmarks/diarization.py [--steps 5,2.5,1] [--no-wait]`; results go to
`benchmarks/results/diarization.md`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.audio import decode_audio
from app.engine.speakers import load_speaker_models
from app.engine.vad import SileroVad
from app.runtime.sessions import RuntimeOptions
from app.service.diarize.activity import Turn
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.job import SpeakerJob, transcribe_speakers
from app.service.diarize.pipeline import DiarizationOptions, Diarizer
from app.service.jobs import TranscriptionJob
from app.service.model_open import OpenOptions, open_model, rss_bytes
from benchmarks.common import add_args, header, start_load, table, write

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "diarization"
MODELS = REPO / "models"
RATE = 16000
HOP = 0.01  # scoring resolution, seconds
CHUNK = 512  # Silero's chunk (32 ms)


@dataclass(frozen=True)
class Utterance:
    speaker: str
    audio: np.ndarray
    speech: np.ndarray  # bool per 10 ms: Silero's speech


@dataclass(frozen=True)
class Conversation:
    name: str
    audio: np.ndarray
    reference: np.ndarray  # [frames, speakers] bool at 10 ms
    overlap: float  # share of speech with two speakers


def utterances(vad: SileroVad) -> list[Utterance]:
    rows = [json.loads(line) for line in (DATA / "manifest.jsonl").read_text().splitlines()]
    found = []
    for row in rows:
        audio = decode_audio((DATA / row["file"]).read_bytes(), RATE)
        probs = vad.probs(audio) > 0.5
        times = np.arange(int(len(audio) / RATE / HOP)) * HOP
        speech = probs[np.minimum((times * RATE / CHUNK).astype(int), len(probs) - 1)]
        found.append(Utterance(row["speaker"], audio, speech))
    return found


def conversation(pool: list[Utterance], speakers: int, seed: int) -> Conversation:
    rng = np.random.default_rng(seed)
    names = sorted({u.speaker for u in pool})
    chosen = list(rng.choice(names, size=speakers, replace=False))
    queue = {s: [u for u in pool if u.speaker == s] for s in chosen}
    for s in chosen:
        rng.shuffle(queue[s])
    order = []
    previous = None
    while any(queue.values()):
        options = [s for s in chosen if queue[s] and s != previous] or [
            s for s in chosen if queue[s]
        ]
        previous = options[int(rng.integers(len(options)))]
        order.append(queue[previous].pop())
    starts, t = [], 0.0
    for u in order:
        starts.append(max(0.0, t))
        end = starts[-1] + len(u.audio) / RATE
        t = end - rng.uniform(1.5, 3.0) if rng.random() < 0.5 else end + rng.uniform(0.2, 1.2)
    total = max(s + len(u.audio) / RATE for s, u in zip(starts, order, strict=True)) + 0.5
    audio = np.zeros(int(total * RATE), np.float32)
    reference = np.zeros((int(total / HOP) + 1, speakers), bool)
    for start, u in zip(starts, order, strict=True):
        first = int(start * RATE)
        audio[first : first + len(u.audio)] += u.audio
        f = round(start / HOP)
        reference[f : f + len(u.speech), chosen.index(u.speaker)] |= u.speech
    talking = reference.sum(axis=1)
    overlap = float((talking > 1).sum() / max((talking > 0).sum(), 1))
    name = f"{speakers} speakers #{seed}"
    return Conversation(name, audio, reference, overlap)


def hypothesis(turns: tuple[Turn, ...], frames: int) -> np.ndarray:
    n = max((t.speaker for t in turns), default=-1) + 1
    found = np.zeros((frames, max(n, 1)), bool)
    for t in turns:
        found[round(t.start / HOP) : round(t.end / HOP), t.speaker] = True
    return found


def der(reference: np.ndarray, found: np.ndarray) -> tuple[float, float, float, float]:
    """(DER, missed, false alarm, confusion), each a share of the reference speech."""
    overlap = reference.astype(np.int64).T @ found.astype(np.int64)  # [ref, hyp] shared frames
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    n_ref, n_hyp = reference.sum(axis=1), found.sum(axis=1)
    correct = np.zeros(len(reference), np.int64)
    for r, h in zip(rows, cols, strict=True):
        correct += reference[:, r] & found[:, h]
    total = n_ref.sum()
    missed = np.maximum(n_ref - n_hyp, 0).sum() / total
    false_alarm = np.maximum(n_hyp - n_ref, 0).sum() / total
    confusion = (np.minimum(n_ref, n_hyp) - correct).sum() / total
    return missed + false_alarm + confusion, missed, false_alarm, confusion


def end_to_end(model: str, runtime: RuntimeOptions, vad: SileroVad, runs: int) -> list[str]:
    """Median time of transcribing the 60 s earnings clip with and without speakers (the speaker
    models loaded and warm), and the RSS the speaker models add."""
    clip = REPO / "tests" / "data" / "audio" / "earnings22_1_4482311_3_62.wav"
    loaded = open_model(model, MODELS / model, OpenOptions(runtime=runtime), vad)
    job = TranscriptionJob(clip.read_bytes(), loaded.base_options, "transcribe")
    before = rss_bytes()
    options = DiarizationOptions()
    diarizer = Diarizer(load_speaker_models(MODELS, runtime, step_s=options.step_s), options)
    transcribe_speakers(loaded, diarizer, job, SpeakerJob())  # warm
    grown = (rss_bytes() - before) / 1e6
    timed = replace(job, options=replace(job.options, word_timestamps=True))
    runs_s: dict[str, list[float]] = {"plain": [], "words": [], "speakers": []}
    for _ in range(runs):
        for kind, run in (
            ("plain", lambda: loaded.transcribe(job)),
            ("words", lambda: loaded.transcribe(timed)),
            ("speakers", lambda: transcribe_speakers(loaded, diarizer, job, SpeakerJob())),
        ):
            started = time.perf_counter()
            run()
            runs_s[kind].append(time.perf_counter() - started)
    p, w, d = (float(np.median(runs_s[k])) for k in ("plain", "words", "speakers"))
    return [
        f"End to end on the 60 s earnings clip with {model} (median of {runs}): transcription "
        f"{p:.1f} s, with word timing {w:.1f} s, with speakers (word timing + diarization) "
        f"{d:.1f} s: +{100 * (d - p) / p:.0f} % over plain, +{100 * (d - w) / w:.0f} % over word "
        f"timing. The speaker models and a first diarization add {grown:.0f} MB RSS.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    parser.add_argument("--steps", default="5,1", help="segmentation window steps (s) to compare")
    parser.add_argument("--per-count", type=int, default=2, help="conversations per speaker count")
    parser.add_argument("--model", default="base", help="Whisper model of the end-to-end time")
    parser.add_argument("--runs", type=int, default=3, help="end-to-end runs (median)")
    args = parser.parse_args()
    load_before = start_load(args)
    vad = SileroVad.load(MODELS / "silero_vad.onnx")
    pool = utterances(vad)
    talks = [
        conversation(pool, speakers, seed)
        for speakers in (2, 3, 4)
        for seed in range(1, args.per_count + 1)
    ]
    runtime = RuntimeOptions(ep="cpu", threads=args.threads)
    rows = []
    for step in (float(s) for s in args.steps.split(",")):
        options = DiarizationOptions(step_s=step)
        diarizer = Diarizer(load_speaker_models(MODELS, runtime, step_s=step), options)
        for talk in talks:
            started = time.perf_counter()
            turns = diarizer(talk.audio, SpeakerHints()).turns
            seconds = time.perf_counter() - started
            found = hypothesis(turns, len(talk.reference))
            total, missed, false_alarm, confusion = der(talk.reference, found)
            duration = len(talk.audio) / RATE
            rows.append(
                [f"{step:g}", talk.name, f"{duration:.0f}", f"{100 * talk.overlap:.0f}",
                 talk.reference.shape[1], found.any(axis=0).sum(), f"{100 * total:.1f}",
                 f"{100 * missed:.1f}", f"{100 * false_alarm:.1f}", f"{100 * confusion:.1f}",
                 f"{seconds:.1f}", f"{seconds / duration:.3f}"]
            )  # fmt: skip
            print(" | ".join(map(str, rows[-1])), flush=True)
    extra = end_to_end(args.model, runtime, vad, args.runs) if args.runs else []
    lines = header(
        "Speaker diarization: DER and time",
        load_before,
        [
            *extra,
            "Seeded conversations of 6 LibriSpeech speakers (tests/data/diarization); DER with "
            "no collar, overlap scored (pyannote's way); CPU EP, "
            f"{args.threads} threads; segmentation + CAM++ embeddings + clustering.",
        ],
    )
    lines += ["", *table(
        ["step s", "conversation", "audio s", "overlap %", "speakers", "found", "DER %",
         "missed %", "false alarm %", "confusion %", "time s", "RTF"],
        rows,
    )]  # fmt: skip
    write(args.out_dir / "diarization.md", lines)


if __name__ == "__main__":
    main()
