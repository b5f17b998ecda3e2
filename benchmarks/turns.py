"""End of turn on real speech: server_vad (each silence duration) against semantic_vad (each
eagerness), as the live session decides them: the VAD's events over the audio, and for
semantic_vad the turn model's judgement at each of its 0.5 s pauses and the pure transitions of
`app.service.live.turns`. No decoding: the decisions are all that is timed.

Conversations: `benchmarks/data/devcorpus` utterances (English read speech, LibriSpeech and
others), in a seeded order, each with a mid-sentence pause of 0.3-1.5 s inserted at one of its
own word gaps (a stretch of silent 20 ms frames at least 1 s from its ends; energy, no
alignment; a read utterance may hold several sentences, so some gaps are sentence ends),
followed by 9 s of silence (the true end of turn). Measured: the share of inserted
pauses a turn ends in (cut), and the delay from the true end of speech (the utterance's last
loud frame) to the end of its turn; the turn model's time per judgement and the RSS it adds.

    .venv/bin/python -m benchmarks.turns

Writes benchmarks/results/turns.md (`--out-name`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

from benchmarks import common
from benchmarks.wer_paired import CORPUS, entries

RATE = 16_000
FRAME = 320  # 20 ms
TAIL_S = 9.0  # silence after each utterance: longer than the longest wait (8 s)
SERVER_SILENCES = (0.5, 0.8, 1.2, 2.0)
EAGERNESS = ("high", "auto", "low")


def loud_frames(audio: np.ndarray) -> np.ndarray:
    frames = audio[: audio.shape[0] // FRAME * FRAME].reshape(-1, FRAME)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return rms >= 0.05 * np.percentile(rms, 90)


def word_gaps(loud: np.ndarray) -> list[int]:
    """Frames in the middle of silent stretches of >= 3 frames, >= 1 s from either end."""
    gaps, start = [], None
    for i, is_loud in enumerate(loud):
        if not is_loud and start is None:
            start = i
        elif is_loud and start is not None:
            if i - start >= 3 and start >= 50 and i <= len(loud) - 50:
                gaps.append((start + i) // 2)
            start = None
    return gaps


@dataclass(frozen=True)
class Command:
    """One utterance with its inserted pause: audio (no trailing silence), the pause (start,
    end samples), the true end of speech (samples), the reference text."""

    audio: np.ndarray
    pause: tuple[int, int]
    end: int
    text: str


def commands(seed: int, limit: int) -> list[Command]:
    """Devcorpus utterances in a seeded order, each with a mid-sentence pause of 0.3-1.5 s
    inserted at one of its own word gaps (utterances without one are left out)."""
    from app.engine.audio import decode_audio

    rng = np.random.default_rng(seed)
    rows = entries(CORPUS)
    found = []
    for index in rng.permutation(len(rows))[:limit]:
        audio = decode_audio(CORPUS / rows[index]["file"])
        loud = loud_frames(audio)
        gaps = word_gaps(loud)
        if not gaps:
            continue
        cut = gaps[rng.integers(len(gaps))] * FRAME
        pause = np.zeros(round(rng.uniform(0.3, 1.5) * RATE), np.float32)
        last = (np.flatnonzero(loud)[-1] + 1) * FRAME + pause.shape[0]
        joined = np.concatenate([audio[:cut], pause, audio[cut:]])
        found.append(Command(joined, (cut, cut + pause.shape[0]), last, rows[index]["text"]))
    return found


def conversation(seed: int, limit: int) -> tuple[np.ndarray, list[tuple[int, int]], list[int]]:
    """The commands joined, each followed by `TAIL_S` of silence: audio; the inserted pauses
    (start, end samples); the true ends of speech (samples)."""
    parts, pauses, ends, at = [], [], [], 0
    tail = np.zeros(round(TAIL_S * RATE), np.float32)
    for command in commands(seed, limit):
        parts += [command.audio, tail]
        pauses.append((at + command.pause[0], at + command.pause[1]))
        ends.append(at + command.end)
        at += command.audio.shape[0] + tail.shape[0]
    return np.concatenate(parts), pauses, ends


def vad_ends(audio: np.ndarray, silence_s: float) -> list[tuple[int, int, int]]:
    """(speech start, silence start, decided at) of each VAD end of speech."""
    from app.engine.vad import CHUNK_SAMPLES, SileroVad, VadOptions, VadStream

    vad = SileroVad.load(common.MODELS_DIR / "silero_vad.onnx")
    stream = VadStream(vad, VadOptions(min_silence_s=silence_s))
    found, start = [], 0
    for i in range(0, audio.shape[0], CHUNK_SAMPLES):
        for event in stream.feed(audio[i : i + CHUNK_SAMPLES]):
            if event.kind == "start":
                start = event.sample
            elif event.kind == "end":
                found.append((start, event.sample, stream.position))
    return found


def score(ended: list[tuple[int, int]], pauses, ends) -> dict:
    """ended: (silence start, decided at) of each turn end."""
    cut = sum(any(lo <= s < hi for s, _ in ended) for lo, hi in pauses)
    delays = []
    for end in ends:
        after = [decided for s, decided in ended if s >= end - RATE // 2]
        if after:
            delays.append((min(after) - end) / RATE)
    p90 = float(np.percentile(delays, 90))
    return {"cut": cut / len(pauses), "delay": statistics.median(delays), "p90": p90,
            "turns": len(ended)}  # fmt: skip


def semantic(audio, candidates, probabilities, eagerness: str) -> list[tuple[int, int]]:
    """The session's decisions (`app.service.live.turns`) over the VAD's 0.5 s pauses."""
    from app.service.live import turns

    rules = turns.TurnRules.of(eagerness)
    turn, ended = turns.Turn(), []
    for (start, silent, decided), finished in zip(candidates, probabilities, strict=True):
        if turn.held_at is not None:  # did the held turn's wait run out before this speech?
            deadline = round((turn.held_at + rules.max_wait_s) * RATE)
            if deadline <= start:
                ended.append((round(turn.held_at * RATE), deadline))
                turn = turns.Turn()
        turn, _ = turns.speech(turn)
        turn, act = turns.pause(turn, silent / RATE, finished, rules)
        if act == "end":
            ended.append((silent, decided))
    if turn.held_at is not None:
        held = round(turn.held_at * RATE)
        ended.append((held, held + round(rules.max_wait_s * RATE)))
    return ended


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--utterances", type=int, default=162)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-name", default="turns.md")
    common.add_args(p)
    args = p.parse_args()
    load = common.start_load(args)
    from app.engine.turn import TURN_FILE, TurnModel

    audio, pauses, ends = conversation(args.seed, args.utterances)
    rss0, _ = common.rss_mb(os.getpid())
    model = TurnModel.load(common.MODELS_DIR / TURN_FILE, threads=1)
    model.probability(audio[: 8 * RATE])
    rss = common.rss_mb(os.getpid())[0] - rss0  # the model loaded, one judgement made
    rows = []
    for silence_s in SERVER_SILENCES:
        found = vad_ends(audio, silence_s)
        s = score([(silent, decided) for _, silent, decided in found], pauses, ends)
        rows.append([f"server_vad {int(silence_s * 1000)} ms", f"{100 * s['cut']:.0f} %",
                     f"{s['delay']:.2f}", f"{s['p90']:.2f}", s["turns"]])  # fmt: skip
    candidates = vad_ends(audio, 0.5)
    probabilities, seconds = [], []
    for start, _, decided in candidates:
        started = time.perf_counter()
        probabilities.append(model.probability(audio[max(start, decided - 8 * RATE) : decided]))
        seconds.append(time.perf_counter() - started)
    for eagerness in EAGERNESS:
        s = score(semantic(audio, candidates, probabilities, eagerness), pauses, ends)
        rows.append([f"semantic_vad {eagerness}", f"{100 * s['cut']:.0f} %",
                     f"{s['delay']:.2f}", f"{s['p90']:.2f}", s["turns"]])  # fmt: skip
    lines = common.header(
        "End of turn: server_vad vs semantic_vad (Smart Turn v3.2) on devcorpus speech",
        load,
        [
            f"{len(ends)} utterances of `benchmarks/data/devcorpus` (seed {args.seed}), each with "
            f"a 0.3-1.5 s pause inserted at a word gap and {TAIL_S:g} s of silence after it "
            f"({audio.shape[0] / RATE / 60:.1f} min). Cut = share of inserted mid-sentence "
            "pauses a turn ended in; delay = median seconds from the true end of speech to the "
            "decision that ended its turn (VAD decisions at 32 ms chunks; the judgement's own "
            "time not included). Turns = turns ended: one per utterance at least; a read "
            "utterance often holds several sentences, and a word gap may fall between two of "
            "them, so some of the cuts and extra turns are sentence ends.",
            f"Turn model: {len(seconds)} judgements, median {1e3 * statistics.median(seconds):.0f}"
            f" ms each (1 thread); RSS +{rss:.0f} MB once loaded and run.",
        ],
    )
    head = ["turn detection", "inserted pauses cut", "end delay s, median", "p90", "turns"]
    common.write(args.out_dir / args.out_name, [*lines, "", *common.table(head, rows)])


if __name__ == "__main__":
    main()
