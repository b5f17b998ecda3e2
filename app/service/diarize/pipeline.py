"""The diarization pipeline: segmentation -> local embeddings -> clustering -> turns -> words.

`Diarizer` runs the speaker models (`app.engine.speakers`) and hands their arrays to the pure
steps (`activity`, `clustering`, `attribution`): an embedding per (window, local speaker) from the
frames where that speaker talks alone (all its frames when it never does for long enough), at most
`max_embed_s` of them, those nearest the window's middle; those talking alone for at least
`min_clean_fraction` of the window train the clustering, every one is assigned. The default cap
is the default step: windows overlap by half, so without it every second of speech went through the
embedding model twice (once per window seeing it); with it, the windows' middles tile the audio
and a speaker talking throughout is embedded about once per second of speech. A cluster that
talks alone for less than `min_alone_s` in the result is no speaker of its own: it joins its most
similar cluster. Then each run of one speaker's speech that the windows dispute (some window
heard another cluster there: a window's local speaker can take in two people, one on each side
of a pause, and its one embedding puts both in one cluster) is embedded on its own and goes to
the cluster it is clearly nearer; about a fifth of the runs, +12 % time. Known speakers'
reference clips are embedded whole.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from app.engine.speakers import SpeakerModels, TooLittleSpeech
from app.engine.speakers.fbank import fbank
from app.engine.speakers.segmentation import FRAME_DURATION_S, FRAME_STEP_S, WINDOW_SAMPLES
from app.runtime.contract import SAMPLE_RATE
from app.service.diarize.activity import (
    UNASSIGNED,
    FrameGrid,
    Turn,
    alone_frames,
    binarize,
    clean_frames,
    disputed,
    fold_quiet_speakers,
    global_activity,
    nearest_middle,
    reassigned,
    runs,
    speaker_count,
    turns,
)
from app.service.diarize.attribution import speaker_labels
from app.service.diarize.clustering import (
    ClusteringOptions,
    SpeakerHints,
    cluster,
    nearer_cluster,
)
from app.service.transcription.transcriber import TranscriptionCancelled

MIN_MASK_FRAMES = 3  # fewer clean frames than this: embed over all the speaker's frames
GRID = FrameGrid(step_s=FRAME_STEP_S, duration_s=FRAME_DURATION_S)


@dataclass(frozen=True)
class DiarizationOptions:
    step_s: float = 5.0  # between segmentation windows (pyannote: 1.0; 5 s costs a fifth)
    clustering: ClusteringOptions = field(default_factory=ClusteringOptions)
    min_clean_fraction: float = 0.2  # pyannote 3.1's min_active_ratio
    known_threshold: float = 0.5  # cosine similarity that names a cluster after a reference
    # less speech alone than this: no speaker of its own (the tuning seeds' least is 5.7 s)
    min_alone_s: float = 2.0
    # speech embedded per (window, speaker), the frames nearest the window's middle: the step,
    # so the windows' middles tile the audio (10 s: the whole window, as pyannote)
    max_embed_s: float = 5.0
    # a run of one speaker talking alone for at least `min_reassign_s`, on at least
    # `min_disputed` of whose frames some window heard another cluster, goes to another cluster
    # when its own embedding is at least `reassign_margin` more similar to that centroid (on 18
    # devcorpus conversations, the 35 runs the windows put in the wrong cluster were 0.19-0.88
    # nearer the right one, the right ones never as much as 0.06 nearer another; on 36, 71 of
    # the 72 runs that move are disputed on 94-100 % of their frames, a fifth of all runs at
    # all: benchmarks/results/live_speakers.md)
    min_reassign_s: float = 0.5
    min_disputed: float = 0.2
    reassign_margin: float = 0.2

    def __post_init__(self) -> None:
        if not (
            0.0 < self.step_s <= 10.0
            and self.max_embed_s > 0.0
            and self.min_reassign_s >= 0.0
            and 0.0 <= self.min_disputed <= 1.0
            and 0.0 <= self.reassign_margin <= 2.0
            and 0.0 <= self.min_clean_fraction <= 1.0
            and -1.0 <= self.known_threshold <= 1.0
            and self.min_alone_s >= 0.0
        ):
            raise ValueError(f"invalid diarization options {self}")


@dataclass(frozen=True)
class Diarization:
    """Global speaker turns (cluster indices) and each cluster's unit centroid [k, d]."""

    turns: tuple[Turn, ...]
    centroids: np.ndarray

    def labels(self, known: Sequence[tuple[str, np.ndarray]], threshold: float) -> dict[int, str]:
        return speaker_labels(self.turns, self.centroids, known, threshold)


class Diarizer:
    """Who speaks when in 16 kHz mono f32 audio (blocking; run it on a worker thread)."""

    def __init__(self, models: SpeakerModels, options: DiarizationOptions) -> None:
        self.segmentation = models.segmentation
        self.embedding = models.embedding
        self.options = options

    def __call__(
        self,
        audio: np.ndarray,
        hints: SpeakerHints,
        cancel: threading.Event | None = None,
    ) -> Diarization:
        activity = self.segmentation(audio)
        windows, frames, local = activity.shape
        starts = self.segmentation.window_starts(len(audio))
        step = WINDOW_SAMPLES
        clean = clean_frames(activity)
        talking = activity.astype(bool)
        cap = round(self.options.max_embed_s / FRAME_STEP_S)
        embeddings = np.full((windows * local, 0), np.nan)
        train = np.zeros(windows * local, dtype=bool)
        for c in range(windows):
            if cancel is not None and cancel.is_set():
                raise TranscriptionCancelled("diarization cancelled")
            if not talking[c].any():
                continue
            first = round(float(starts[c]) * SAMPLE_RATE)
            rows = fbank(_padded(audio[first : first + step], step))  # once for its speakers
            for s in range(local):
                if not talking[c, :, s].any():
                    continue
                n_clean = int(clean[c, :, s].sum())
                mask = clean[c, :, s] if n_clean >= MIN_MASK_FRAMES else talking[c, :, s]
                mask = nearest_middle(mask, cap)
                try:
                    vector = self.embedding.of_fbank(rows, step, mask.astype(np.float32))
                except TooLittleSpeech:
                    continue  # a few frames only: left out of the clustering
                if embeddings.shape[1] == 0:
                    embeddings = np.full((windows * local, vector.shape[0]), np.nan)
                embeddings[c * local + s] = vector
                train[c * local + s] = n_clean >= self.options.min_clean_fraction * frames
        if embeddings.shape[1] == 0:  # nobody talks
            return Diarization((), np.zeros((0, 0)))
        clusters = cluster(embeddings, train, hints, self.options.clustering)
        labels = clusters.labels.reshape(windows, local)
        labels[~talking.any(axis=1)] = UNASSIGNED
        k = len(clusters.centroids)
        count = speaker_count(activity, starts, GRID)
        summed = global_activity(activity, labels, starts, GRID, k)
        binary = binarize(summed, count)
        into = fold_quiet_speakers(
            alone_frames(binary) * GRID.step_s,
            clusters.centroids,
            self.options.min_alone_s,
            hints.bounds(k)[0],
        )
        kept = into == np.arange(k)
        if not kept.all():
            renumbered = (np.cumsum(kept) - 1)[into]
            labels = np.where(labels == UNASSIGNED, UNASSIGNED, renumbered[labels])
            summed = global_activity(activity, labels, starts, GRID, int(kept.sum()))
            binary = binarize(summed, count)
        binary, centroids = self._reassigned(
            audio, summed, binary, clusters.centroids[kept], hints.bounds(k)[0], cancel
        )
        duration = len(audio) / SAMPLE_RATE
        return Diarization(turns(binary, GRID, duration), centroids)

    def _reassigned(
        self,
        audio: np.ndarray,
        summed: np.ndarray,
        binary: np.ndarray,
        centroids: np.ndarray,
        fewest: int,
        cancel: threading.Event | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`binary` [T, k] with each run the windows dispute, of one speaker talking alone
        long enough, given to the cluster its own embedding is nearer (a window whose local
        speaker took in two people, one on each side of a pause, put both in one cluster); a
        cluster left with too little speech alone joins its most similar one. Returns
        (binary, centroids)."""
        alone = clean_frames(binary)
        cap = round(self.options.max_embed_s / FRAME_STEP_S)
        moves = []
        for run in runs(binary):
            if cancel is not None and cancel.is_set():
                raise TranscriptionCancelled("diarization cancelled")
            mask = alone[run.on : run.off, run.speaker]
            if (
                mask.sum() * GRID.step_s < self.options.min_reassign_s
                or disputed(summed, binary, run) < self.options.min_disputed
            ):
                continue
            first, last = (round(float(GRID.middle(f)) * SAMPLE_RATE) for f in (run.on, run.off))
            clip = _padded(audio[first:last], last - first)
            try:
                vector = self.embedding(clip, nearest_middle(mask, cap).astype(np.float32))
            except TooLittleSpeech:
                continue
            into = nearer_cluster(centroids @ vector, run.speaker, self.options.reassign_margin)
            if into != run.speaker:
                moves.append((run, into))
        binary, kept = reassigned(binary, moves, centroids, self.options.min_alone_s, fewest, GRID)
        return binary, centroids[kept]

    def reference(self, clip: np.ndarray) -> np.ndarray:
        """The embedding of a known speaker's reference clip (all of it)."""
        return self.embedding(clip, None)


def _padded(window: np.ndarray, samples: int) -> np.ndarray:
    """The last window, shorter than the others, zero-padded as the segmentation saw it."""
    if len(window) >= samples:
        return window
    return np.concatenate([window, np.zeros(samples - len(window), dtype=window.dtype)])
