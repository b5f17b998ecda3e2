"""Live speakers, offline: does a label hold for the whole session, and is the count right?

Seeded conversations of 2, 3 and 4 devcorpus readers (`benchmarks/data/devcorpus`), none of the 8
the live threshold was chosen on (`app.service.diarize.book`): each reader says 3 of their clips,
in a shuffled order where nobody speaks twice in a row, 0.6-1.2 s apart. Each utterance is one
item, as the Realtime protocol's server VAD cuts turns at such pauses (0.3 s of audio before it,
as `prefix_padding_ms`); the session's `LiveSpeakers` labels them in order, hearing the audio as
it comes. Beside it, the whole conversation diarized as an upload (`Diarizer`, no hints).

Scores per conversation: the share of speech time (utterance durations) with the right label
under the best one-to-one mapping of labels to readers over the whole session (a label that
changes its person, or an extra label, costs time), and the number of labels. Enrolled: every
reader but the last chosen is enrolled from a fourth clip of theirs; the share of the enrolled
readers' time named right, and whether the unenrolled reader was ever given an enrolled name.
The same enrolled readers named by the upload pipeline (as a request's known speakers).
Compute only (no server): the time per item is the speaker models' cost of a live item.

    .venv/bin/python -m benchmarks.live_speakers --seeds 1,2,3 \
        --out benchmarks/results/live_speakers.md
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engine.audio import decode_audio
from app.runtime.placement import RuntimeOptions
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.job import SPEAKER_THREADS, LazyDiarizer
from app.service.diarize.live import LiveSpeakers
from benchmarks import wer_paired
from benchmarks.common import MODELS_DIR, header, load1, report, table

RATE = 16000
PAD_S = 0.3
# the readers the live threshold was chosen on (app/service/diarize/book.py)
TUNED = {"libri-7367", "libri-460", "libri-332", "libri-163", "libri-118", "libri-8629",
         "libri-1867", "libri-2136"}  # fmt: skip


@dataclass(frozen=True)
class Conversation:
    audio: np.ndarray
    spans: tuple[tuple[float, float, str], ...]  # each utterance: start, end, reader
    enrol: dict[str, np.ndarray]  # each reader's fourth clip


def readers() -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = defaultdict(list)
    for entry in wer_paired.entries(wer_paired.CORPUS):
        if entry["speaker"] not in TUNED:
            by[entry["speaker"]].append(entry)
    return dict(sorted(by.items()))


def conversation(pool: dict[str, list[dict]], count: int, seed: int) -> Conversation:
    rng = np.random.default_rng(seed * 10 + count)
    chosen = [str(s) for s in rng.choice(sorted(pool), count, replace=False)]
    clips = {s: [pool[s][i] for i in rng.choice(len(pool[s]), 4, replace=False)] for s in chosen}
    order: list[str] = []
    while not order or any(a == b for a, b in itertools.pairwise(order)):
        order = [str(s) for s in rng.permutation([s for s in chosen for _ in range(3)])]
    used = dict.fromkeys(chosen, 0)
    pieces, spans, t = [], [], 0.0
    for reader in order:
        audio = decode_audio(wer_paired.CORPUS / clips[reader][used[reader]]["file"])
        used[reader] += 1
        gap = np.zeros(round(rng.uniform(0.6, 1.2) * RATE), np.float32)
        pieces += [audio, gap]
        spans.append((t, t + len(audio) / RATE, reader))
        t += (len(audio) + len(gap)) / RATE
    enrol = {s: decode_audio(wer_paired.CORPUS / clips[s][3]["file"]) for s in chosen}
    return Conversation(np.concatenate(pieces), tuple(spans), enrol)


def live_labels(
    diarizer: LazyDiarizer, talk: Conversation, known: list[tuple[str, np.ndarray]]
) -> tuple[list[dict[str, float]], float]:
    """Per utterance, seconds of each label the live session gave it; seconds per item."""
    speakers = LiveSpeakers(diarizer, lambda: known)
    heard, out, spent = 0, [], 0.0
    for start, end, _ in talk.spans:
        until = min(round((end + 0.5) * RATE), len(talk.audio))  # the item ended, a bit after
        speakers.hear(talk.audio[heard:until])
        heard = until
        began = time.perf_counter()
        turns, labels = speakers.turns(max(start - PAD_S, 0.0), end)
        spent += time.perf_counter() - began
        out.append(_seconds(turns, labels, start, end))
    return out, spent / len(talk.spans)


def upload_labels(
    diarizer: LazyDiarizer, talk: Conversation, knowns: list[list[tuple[str, np.ndarray]]]
) -> list[list[dict[str, float]]]:
    """The conversation diarized once as an upload; for each of `knowns` (a request's known
    speakers, names given), per utterance, seconds of each label."""
    model = diarizer.get()
    found = model(talk.audio, SpeakerHints())
    labelled = [found.labels(known, model.options.known_threshold) for known in knowns]
    return [[_seconds(found.turns, labels, start, end) for start, end, _ in talk.spans]
            for labels in labelled]  # fmt: skip


def named(
    talk: Conversation, said: list[dict[str, float]], people: list[str]
) -> tuple[float, bool]:
    """With every reader but the last enrolled: the share of the enrolled readers' time named
    right, and whether the last one was ever given an enrolled name."""
    truth = [reader for _, _, reader in talk.spans]
    durations = [end - start for start, end, _ in talk.spans]
    guess = [max(s, key=s.get) if s else "" for s in said]
    enrolled_time = sum(d for t, d in zip(truth, durations, strict=True) if t != people[-1])
    right = sum(d for g, t, d in zip(guess, truth, durations, strict=True)
                if t != people[-1] and g == t) / enrolled_time  # fmt: skip
    stranger = any(g in people[:-1] for g, t in zip(guess, truth, strict=True)
                   if t == people[-1])  # fmt: skip
    return right, stranger


def _seconds(turns, labels: dict[int, str], start: float, end: float) -> dict[str, float]:
    said: dict[str, float] = defaultdict(float)
    for turn in turns:
        shared = min(turn.end, end) - max(turn.start, start)
        if shared > 0:
            said[labels[turn.speaker]] += shared
    return dict(said)


def mapped_share(talk: Conversation, said: list[dict[str, float]]) -> float:
    """Share of utterance time whose majority label maps to its reader (best 1:1 mapping)."""
    truth = [reader for _, _, reader in talk.spans]
    durations = [end - start for start, end, _ in talk.spans]
    guess = [max(s, key=s.get) if s else "" for s in said]
    names = sorted({g for g in guess if g})
    people = sorted(set(truth))
    best = 0.0
    for chosen in itertools.permutations(names, min(len(names), len(people))):
        mapping = dict(zip(chosen, people, strict=False))
        right = sum(d for g, t, d in zip(guess, truth, durations, strict=True)
                    if mapping.get(g) == t)  # fmt: skip
        best = max(best, right)
    return best / sum(durations)


def labels_used(said: list[dict[str, float]]) -> int:
    return len({max(s, key=s.get) for s in said if s})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--counts", default="2,3,4")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = load1()
    runtime = RuntimeOptions(device="CPU", threads=SPEAKER_THREADS)
    diarizer = LazyDiarizer(MODELS_DIR, runtime)
    pool = readers()
    rows, summary = [], defaultdict(list)
    for count in (int(c) for c in args.counts.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            talk = conversation(pool, count, seed)
            live, per_item = live_labels(diarizer, talk, [])
            people = list(dict.fromkeys(reader for _, _, reader in talk.spans))
            model = diarizer.get()
            known = [(p, model.reference(talk.enrol[p])) for p in people[:-1]]
            upload, upload_known = upload_labels(diarizer, talk, [[], known])
            live_named = named(talk, live_labels(diarizer, talk, known)[0], people)
            upload_named = named(talk, upload_known, people)
            seconds = len(talk.audio) / RATE
            row = (count, seed, f"{seconds:.0f}", f"{mapped_share(talk, live):.3f}",
                   labels_used(live), f"{mapped_share(talk, upload):.3f}", labels_used(upload),
                   f"{live_named[0]:.3f}", "yes" if live_named[1] else "no",
                   f"{upload_named[0]:.3f}", "yes" if upload_named[1] else "no",
                   f"{per_item * 1000:.0f}")  # fmt: skip
            rows.append(row)
            summary[count].append((mapped_share(talk, live), labels_used(live) == count,
                                   mapped_share(talk, upload), labels_used(upload) == count,
                                   *live_named, *upload_named))  # fmt: skip
            print(row, flush=True)
    head = ["speakers", "seed", "seconds", "live right", "live labels", "upload right",
            "upload labels", "live: enrolled named right", "live: stranger named",
            "upload: enrolled named right", "upload: stranger named", "ms per item"]  # fmt: skip
    lines = header("Live speakers (offline, devcorpus conversations)", load_before)
    lines += ["", *table(head, rows), ""]
    for count, results in summary.items():
        r = np.array(results, dtype=float)
        lines.append(
            f"- {count} speakers: live {r[:, 0].mean():.3f} of the time right, count right "
            f"{int(r[:, 1].sum())}/{len(r)}; upload {r[:, 2].mean():.3f}, count right "
            f"{int(r[:, 3].sum())}/{len(r)}; enrolled named live {r[:, 4].mean():.3f} / upload "
            f"{r[:, 6].mean():.3f}, a stranger named live {int(r[:, 5].sum())}/{len(r)} / upload "
            f"{int(r[:, 7].sum())}/{len(r)}"
        )
    report(args.out, lines, rows)


if __name__ == "__main__":
    main()
