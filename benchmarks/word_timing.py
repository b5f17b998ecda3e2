"""Word timing: ours against faster-whisper's `word_timestamps=True` (same weights, same clip,
same beam), against a ground truth built from the long clip, and what words cost.

1. Agreement with faster-whisper: every English clip of the repo, both models. Words are paired
   by aligning the two normalised word sequences (difflib; only equal words are paired); the
   table gives |start difference| and |end difference|, median and p90, in ms, and the share of
   words paired.
2. Ground truth: the 10 min clip is the English clips played one after another with 0.5 s gaps
   (`common.long_clip()`), so where each clip starts in it is known. Where the speech in each
   clip starts, two ways: its first 10 ms frame within 25 dB of the clip's loudest (our word
   timing also starts words at a level threshold, so this reference is not independent of it),
   and the start of Silero VAD's first speech region (a trained model, independent). The first
   word after each clip boundary should start there: the table gives the start error (the
   absolute difference of word start and onset; median, p90) for ours and faster-whisper,
   both with their defaults otherwise.
3. Cost: end-to-end time on the 60 s clip with words off and on (ours), greedy and beam 5,
   runs alternated; the ratio of medians.

    .venv/bin/python -m benchmarks.word_timing --models tiny.en,base --repeats 3

Writes benchmarks/results/word_timing.md.
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import common
from benchmarks.common import CONFIGS, REPO

OURS, PEER = CONFIGS["ov-int8"], CONFIGS["fw-int8"]
ONSET_DB = 25.0  # speech onset: the first 10 ms frame within this of the clip's loudest
GAP_S = 0.5  # the long clip's silence between clips (common.long_clip)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--beams", default="1,5")
    p.add_argument("--repeats", type=int, default=3, help="cost runs per setting (median)")
    p.add_argument("--long-model", default="base", help="model for the ground-truth part")
    common.add_args(p)
    return p.parse_args()


def paired(ours: list, theirs: list) -> list[tuple[list, list]]:
    """Pairs of [word, start, end] whose normalised words are equal, in sequence order."""
    a = [common.normalize(w[0]) for w in ours]
    b = [common.normalize(w[0]) for w in theirs]
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    pairs = []
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            if a[block.a + k]:
                pairs.append((ours[block.a + k], theirs[block.b + k]))
    return pairs


def p90(values: list[float]) -> float:
    return float(np.percentile(values, 90)) if values else float("nan")


def speech_onset(path: Path) -> float:
    """Seconds to the first 10 ms frame within ONSET_DB of the clip's loudest frame."""
    from app.engine.audio import decode_audio

    audio = decode_audio(path)
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)
    level = 10 * np.log10((frames**2).mean(axis=1) + 1e-12)
    return float(np.argmax(level > level.max() - ONSET_DB)) * 0.01


def vad_onset(path: Path) -> float:
    """Seconds to the start of the first speech region Silero VAD finds (no padding): a second
    reference, independent of the level threshold our word timing also uses."""
    from app.engine.audio import decode_audio
    from app.engine.vad import VAD_FILE, SileroVad, VadOptions
    from app.engine.vad_spans import speech_timestamps

    vad = SileroVad.load(REPO / "models" / VAD_FILE)
    spans = speech_timestamps(vad, decode_audio(path), VadOptions(speech_pad_s=0.0))
    return spans[0].start / common.SAMPLE_RATE if spans else 0.0


def clip_onsets(onset=speech_onset) -> list[float]:
    """Known speech onsets (s) of every clip played in the long clip, in order."""
    clips = common.english_clips()
    within = {e["file"]: onset(common.TESTDATA / e["file"]) for e in clips}
    onsets, offset = [], 0.0
    total = common.clip_duration(common.long_clip())
    while offset < total:
        for entry in clips:
            onsets.append(offset + within[entry["file"]])
            offset += common.clip_duration(common.TESTDATA / entry["file"]) + GAP_S
    return [t for t in onsets if t < total]


def agreement(args: argparse.Namespace, model: str, rows: list) -> None:
    with common.workers(model, (OURS, PEER), args.threads) as workers:
        for beam in (int(b) for b in args.beams.split(",")):
            starts: list[float] = []
            ends: list[float] = []
            n_ours = n_paired = 0
            for i, entry in enumerate(common.english_clips()):
                path = common.TESTDATA / entry["file"]
                words = {}
                for config in common.rotate([OURS, PEER], i):
                    reply = workers[config.key].transcribe(path, beam, word_timestamps=True)
                    words[config.key] = reply["words"]
                pairs = paired(words[OURS.key], words[PEER.key])
                n_ours += len(words[OURS.key])
                n_paired += len(pairs)
                starts += [abs(a[1] - b[1]) * 1000 for a, b in pairs]
                ends += [abs(a[2] - b[2]) * 1000 for a, b in pairs]
            rows.append([
                model, str(beam), f"{statistics.median(starts):.0f}", f"{p90(starts):.0f}",
                f"{statistics.median(ends):.0f}", f"{p90(ends):.0f}",
                f"{100 * n_paired / max(n_ours, 1):.1f} %", f"{common.load1():.1f}",
            ])  # fmt: skip
            print(rows[-1], file=sys.stderr)


def ground_truth(args: argparse.Namespace, rows: list) -> None:
    references = {"level onset": clip_onsets(), "Silero VAD onset": clip_onsets(vad_onset)}
    clip = common.long_clip()
    with common.workers(args.long_model, (OURS, PEER), args.threads) as workers:
        for config in (OURS, PEER):
            reply = workers[config.key].transcribe(clip, 5, word_timestamps=True)
            starts = np.array([w[1] for w in reply["words"]])
            for name, onsets in references.items():
                errors = []
                for onset in onsets:
                    # the first word starting after the gap before this clip
                    after = starts[starts >= onset - GAP_S + 0.05]
                    if after.size:
                        errors.append(abs(after[0] - onset) * 1000)
                rows.append([
                    config.label, name, str(len(errors)), f"{statistics.median(errors):.0f}",
                    f"{p90(errors):.0f}", f"{sum(e <= 100 for e in errors)}/{len(errors)}",
                ])  # fmt: skip
                print(rows[-1], file=sys.stderr)


def cost(args: argparse.Namespace, model: str, rows: list) -> None:
    clip = common.TESTDATA / "audio" / "earnings22_1_4482311_3_62.wav"
    with common.workers(model, (OURS,), args.threads) as started:
        worker = started[OURS.key]
        for beam in (1, 5):
            times: dict[bool, list[float]] = {False: [], True: []}
            aligns: list[float] = []
            for r in range(args.repeats):
                for words in common.rotate([False, True], r):
                    reply = worker.transcribe(clip, beam, word_timestamps=words)
                    times[words].append(reply["total_s"])
                    if words:
                        aligns.append(reply["stats"]["align_s"])
            off, on = statistics.median(times[False]), statistics.median(times[True])
            rows.append([
                model, str(beam), f"{off:.2f}", f"{on:.2f}", f"{on / off:.3f}",
                f"{statistics.median(aligns):.3f}", f"{common.load1():.1f}",
            ])  # fmt: skip
            print(rows[-1], file=sys.stderr)


def main() -> None:
    args = parse_args()
    models = args.models.split(",")
    common.normalize("warm up")
    for model in dict.fromkeys([*models, args.long_model]):
        common.peer_model_dir(model)
        common.prepare_models(model, [OURS, PEER])
    load_before = common.start_load(args)
    started = time.time()
    agree: list = []
    truth: list = []
    costs: list = []
    for model in models:
        agreement(args, model, agree)
    ground_truth(args, truth)
    for model in models:
        cost(args, model, costs)
    lines = common.header(
        "Word timing: ours vs faster-whisper `word_timestamps=True` (same weights)",
        load_before,
        [f"Ours: {OURS.label}; peer: {PEER.label}. Wall time {time.time() - started:.0f} s."],
    )
    lines += ["", "## Agreement with faster-whisper (the repo's English clips)", ""]
    lines += common.table(
        ["model", "beam", "start median ms", "start p90 ms", "end median ms", "end p90 ms",
         "words paired", "load"], agree,
    )  # fmt: skip
    lines += ["", f"## Ground truth: first word after each clip boundary ({args.long_model}, "
              "beam 5, 10 min clip)", ""]  # fmt: skip
    lines += common.table(
        [
            "system",
            "reference",
            "boundaries",
            "start error median ms",
            "p90 ms",
            "within 100 ms",
        ],
        truth,
    )
    lines += ["", "## Cost of words on the 60 s clip (ours, median end-to-end s)", ""]
    lines += common.table(
        ["model", "beam", "words off", "words on", "on / off", "align s", "load"], costs
    )
    common.write(args.out_dir / "word_timing.md", lines)


if __name__ == "__main__":
    main()
