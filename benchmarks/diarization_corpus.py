"""The diarization benchmark's audio: seeded conversations of real speech and the repo's real
recordings, each with a reference of who talks when (10 ms) and which words each speaker says.

Speakers: the 6 LibriSpeech speakers of `tests/data/diarization` (3 utterances each, copied from
`shared/devcorpus`), JFK (`tests/data/audio/jfk.wav`, one 11 s utterance) and the earnings call
(`tests/data/audio/earnings22_1_4482311_3_62.wav`, 60 s cut at its two pauses nearest 20 s and
40 s into 3 utterances). A conversation: 2-4 of them take turns, utterance after utterance, with
pauses of 0.2-1.2 s or, for half of the turns, the next speaker starting 1.5-3 s before the
previous one stops (overlapped speech); a seed whose conversation is outside 1-5 min or 5-15 %
overlapped speech is passed over (`held_out`), and so are the seeds the pipeline was tuned on.
Reference words: the LibriSpeech and JFK transcripts; the earnings pieces have none (the clip's
transcript is not timed), so their words are not scored (WDER).

Reference speech, stated up front. Each utterance's speech is Silero VAD's (threshold 0.5, 32 ms
decisions), placed where it was mixed in; then each speaker's pauses shorter than 0.3 s are
bridged into one segment (`reference`). That is how human-made diarization references mark
speech, and what published DERs are scored against: the NIST Rich Transcription evaluations
bridge a speaker's pauses under 0.3 s into one segment, and DIHARD's task definition
(dihardchallenge.github.io/dihard1/overview.html) does not count a speaker's pauses of up to
200 ms as segment breaks but bridges them into one continuous segment. Raw Silero splits every
short pause inside a sentence, which a human annotation does not mark. The raw reference (`raw`)
is scored too, as a second figure, so nothing is hidden. (AMI's word-level references, as
pyannote's AMI setup builds them, merge adjacent words only: a stricter convention than either.)
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import numpy as np

from app.engine.audio import decode_audio
from app.engine.vad import SileroVad
from benchmarks.common import REPO

DATA = REPO / "tests" / "data" / "diarization"
AUDIO = REPO / "tests" / "data" / "audio"
RATE = 16000
HOP = 0.01  # scoring resolution, seconds
CHUNK = 512  # Silero's chunk (32 ms)
BRIDGE_S = 0.3  # a speaker's reference pauses shorter than this are bridged (NIST RT)
TUNING_SEEDS = frozenset({101, 102, 103})  # the pipeline's options were chosen on these
MIN_S, MAX_S = 60.0, 300.0  # a conversation's length
MIN_OVERLAP, MAX_OVERLAP = 0.05, 0.15  # its share of overlapped speech
EARNINGS = "earnings22_1_4482311_3_62.wav"
JFK_TEXT = (
    "And so my fellow Americans, ask not what your country can do for you, ask what you can do "
    "for your country."
)
# The repo's real recordings (tests/data/audio, shared/testdata): every one has one speaker or
# none; shared/devcorpus holds single-speaker LibriSpeech utterances only.
REAL = (
    EARNINGS,
    "jfk.wav",
    "2412-153948-0000.flac",
    "1089-134686-0000.flac",
    "picovoice_test_es.wav",
    "picovoice_empty.wav",
)


@dataclass(frozen=True)
class Utterance:
    speaker: str
    audio: np.ndarray
    speech: np.ndarray  # bool per 10 ms: Silero's speech
    text: str | None  # the reference transcript; None: not scored for words


@dataclass(frozen=True)
class Conversation:
    name: str
    audio: np.ndarray
    reference: np.ndarray  # [frames, speakers] bool at 10 ms: pauses < BRIDGE_S bridged
    raw: np.ndarray  # the same from Silero's raw decisions
    overlap: float  # share of reference speech with two speakers
    words: tuple[tuple[str, int], ...]  # (reference text, speaker) per utterance, in order


def speech(vad: SileroVad, audio: np.ndarray) -> np.ndarray:
    """Silero's speech (threshold 0.5) per 10 ms frame."""
    probs = vad.probs(audio) > 0.5
    times = np.arange(int(len(audio) / RATE / HOP)) * HOP
    return probs[np.minimum((times * RATE / CHUNK).astype(int), len(probs) - 1)]


def bridged(reference: np.ndarray, max_pause_s: float = BRIDGE_S) -> np.ndarray:
    """[frames, speakers] with each speaker's pauses shorter than `max_pause_s` filled."""
    out = reference.copy()
    for s in range(reference.shape[1]):
        edges = np.diff(np.concatenate([[0], reference[:, s].astype(np.int8), [0]]))
        ends, starts = np.flatnonzero(edges == -1)[:-1], np.flatnonzero(edges == 1)[1:]
        for a, b in zip(ends, starts, strict=True):
            if (b - a) * HOP < max_pause_s - 1e-9:
                out[a:b, s] = True
    return out


def overlap_share(reference: np.ndarray) -> float:
    talking = reference.sum(axis=1)
    return float((talking > 1).sum() / max((talking > 0).sum(), 1))


def _utterance(vad: SileroVad, speaker: str, audio: np.ndarray, text: str | None) -> Utterance:
    return Utterance(speaker, audio, speech(vad, audio), text)


def _pieces(vad: SileroVad, audio: np.ndarray, at_s: tuple[float, ...]) -> list[np.ndarray]:
    """`audio` cut in the middle of the pauses (no speech) nearest each time of `at_s`."""
    quiet = ~speech(vad, audio)
    middles = []
    for t in at_s:
        frames = np.flatnonzero(quiet)
        middles.append(int(frames[np.argmin(np.abs(frames * HOP - t))]))
    edges = [0, *(round(m * HOP * RATE) for m in middles), len(audio)]
    return [audio[a:b] for a, b in itertools.pairwise(edges)]


def utterances(vad: SileroVad) -> list[Utterance]:
    rows = [json.loads(line) for line in (DATA / "manifest.jsonl").read_text().splitlines()]
    found = [
        _utterance(
            vad, row["speaker"], decode_audio((DATA / row["file"]).read_bytes(), RATE), row["text"]
        )
        for row in rows
    ]
    found.append(
        _utterance(vad, "jfk", decode_audio((AUDIO / "jfk.wav").read_bytes(), RATE), JFK_TEXT)
    )
    earnings = decode_audio((AUDIO / EARNINGS).read_bytes(), RATE)
    found += [_utterance(vad, "earnings22", p, None) for p in _pieces(vad, earnings, (20, 40))]
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
    raw = np.zeros((int(total / HOP) + 1, speakers), bool)
    for start, u in zip(starts, order, strict=True):
        first = int(start * RATE)
        audio[first : first + len(u.audio)] += u.audio
        f = round(start / HOP)
        raw[f : f + len(u.speech), chosen.index(u.speaker)] |= u.speech
    reference = bridged(raw)
    words = tuple((u.text, chosen.index(u.speaker)) for u in order if u.text is not None)
    return Conversation(
        f"{speakers} speakers #{seed}", audio, reference, raw, overlap_share(reference), words
    )


def held_out(
    pool: list[Utterance], speakers: int, first_seed: int, count: int
) -> tuple[list[Conversation], list[int]]:
    """`count` conversations of 1-5 min with 5-15 % overlapped speech from the seeds after
    `first_seed` (the tuning seeds left out), and the seeds passed over for length or overlap."""
    found, passed, seed = [], [], first_seed
    while len(found) < count:
        if seed not in TUNING_SEEDS:
            talk = conversation(pool, speakers, seed)
            fits = MIN_S <= len(talk.audio) / RATE <= MAX_S
            if fits and MIN_OVERLAP <= talk.overlap <= MAX_OVERLAP:
                found.append(talk)
            else:
                passed.append(seed)
        seed += 1
    return found, passed


def recording(vad: SileroVad, name: str) -> Conversation:
    """A real recording of one speaker (or none): the reference is its Silero speech."""
    audio = decode_audio((AUDIO / name).read_bytes(), RATE)
    found = speech(vad, audio)
    raw = np.zeros((len(found) + 1, 1), bool)
    raw[: len(found), 0] = found
    return Conversation(name, audio, bridged(raw), raw, 0.0, ())
