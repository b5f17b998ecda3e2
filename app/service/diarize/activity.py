"""Local speaker activity of sliding windows -> global speaker turns (the pyannote 3.x way).

The segmentation model gives, per window `c` (10 s, starting at `starts[c]` seconds) and per frame
`f` of it, the binary activity of up to 3 *local* speakers. Windows overlap, so every global frame
is seen by several windows: the number of speakers talking at a frame is the rounded mean of the
windows' counts there; once each window's local speakers are mapped to global clusters, a frame
goes to the `count` clusters with the most summed activity. Pure functions over arrays; the window
loop keeps memory at one window's slice beside the global `[frames, clusters]` result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

UNASSIGNED = -1  # a local speaker that is silent in its window (no cluster)


@dataclass(frozen=True)
class FrameGrid:
    """Where the segmentation frames are: frame `f` of a window starting at `t` covers
    `[t + f * step_s, t + f * step_s + duration_s]` (pyannote's receptive field)."""

    step_s: float
    duration_s: float

    def __post_init__(self) -> None:
        if not (self.step_s > 0 and self.duration_s > 0):
            raise ValueError(f"frame step and duration must be > 0, got {self}")

    def first_frame(self, window_start_s: float) -> int:
        """Global index of a window's frame 0 (pyannote's `closest_frame`)."""
        return round(window_start_s / self.step_s)

    def middle(self, frame: int | np.ndarray) -> float | np.ndarray:
        """Time (seconds) of a global frame's middle."""
        return frame * self.step_s + 0.5 * self.duration_s


@dataclass(frozen=True)
class Turn:
    """One speaker talking from `start` to `end` (seconds); `speaker` is a cluster index."""

    start: float
    end: float
    speaker: int


def speech_seconds(turns: Sequence[Turn], speakers: int) -> list[float]:
    """Seconds of speech of each of `speakers` speakers (by index) in `turns`."""
    seconds = [0.0] * speakers
    for turn in turns:
        seconds[turn.speaker] += turn.end - turn.start
    return seconds


def global_frames(starts: np.ndarray, frames_per_window: int, grid: FrameGrid) -> int:
    """Number of global frames the windows cover."""
    if len(starts) == 0:
        return 0
    return grid.first_frame(float(starts[-1])) + frames_per_window


def speaker_count(activity: np.ndarray, starts: np.ndarray, grid: FrameGrid) -> np.ndarray:
    """[T] int: how many speakers talk at each global frame (windows' counts averaged, rounded).

    activity: [windows, frames, local speakers] in {0, 1}; starts: [windows] seconds.
    """
    windows, frames, _ = activity.shape
    total = np.zeros(global_frames(starts, frames, grid), dtype=np.float64)
    seen = np.zeros_like(total)
    for c in range(windows):
        first = grid.first_frame(float(starts[c]))
        total[first : first + frames] += activity[c].sum(axis=1)
        seen[first : first + frames] += 1.0
    mean = np.divide(total, seen, out=np.zeros_like(total), where=seen > 0)
    return np.rint(mean).astype(np.int64)


def global_activity(
    activity: np.ndarray, clusters: np.ndarray, starts: np.ndarray, grid: FrameGrid, n: int
) -> np.ndarray:
    """[T, n]: each cluster's activity summed over the windows (a window's local speakers mapped
    to the same cluster count once, as their maximum).

    clusters: [windows, local speakers] cluster index or UNASSIGNED.
    """
    windows, frames, _ = activity.shape
    summed = np.zeros((global_frames(starts, frames, grid), n), dtype=np.float64)
    for c in range(windows):
        first = grid.first_frame(float(starts[c]))
        for k in set(clusters[c].tolist()) - {UNASSIGNED}:
            mine = clusters[c] == k
            summed[first : first + frames, k] += activity[c][:, mine].max(axis=1)
    return summed


def binarize(summed: np.ndarray, count: np.ndarray) -> np.ndarray:
    """[T, n] bool: at each frame the `count` clusters with the most activity (ties: lower
    index first), never a cluster with none."""
    frames, n = summed.shape
    order = np.argsort(-summed, axis=1, kind="stable")
    rank = np.empty_like(order)
    rank[np.arange(frames)[:, None], order] = np.arange(n)[None, :]
    return (rank < np.minimum(count[:frames], n)[:, None]) & (summed > 0)


@dataclass(frozen=True)
class Run:
    """Frames `on` to `off` (exclusive) of one cluster's activity, without a break."""

    speaker: int
    on: int
    off: int


def runs(binary: np.ndarray) -> tuple[Run, ...]:
    """Each cluster's runs of active frames in `binary` [T, n], sorted by first frame."""
    found: list[Run] = []
    for k in range(binary.shape[1]):
        edges = np.diff(np.concatenate(([0], binary[:, k].astype(np.int8), [0])))
        for on, off in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
            found.append(Run(k, int(on), int(off)))
    return tuple(sorted(found, key=lambda r: (r.on, r.speaker)))


def turns(binary: np.ndarray, grid: FrameGrid, duration_s: float) -> tuple[Turn, ...]:
    """Each cluster's runs of active frames as turns (frame middles, clipped to the audio),
    sorted by start."""
    found: list[Turn] = []
    for run in runs(binary):
        start = min(float(grid.middle(run.on)), duration_s)
        end = min(float(grid.middle(run.off)), duration_s)
        if end > start:
            found.append(Turn(round(start, 3), round(end, 3), run.speaker))
    return tuple(found)


def alone_frames(binary: np.ndarray) -> np.ndarray:
    """[n] how many frames each cluster of `binary` [T, n] talks with nobody else."""
    return clean_frames(binary).sum(axis=0)


def fold_quiet_speakers(
    alone: np.ndarray, centroids: np.ndarray, min_alone: float, fewest: int
) -> np.ndarray:
    """[k] the cluster each of k clusters becomes (itself, or the one it joins): one that talks
    alone for less than `min_alone` joins its most similar remaining cluster (unit `centroids`
    [k, d]), the quietest first, while more than `fewest` remain."""
    k = len(alone)
    into = np.arange(k)
    kept = np.ones(k, dtype=bool)
    for j in np.argsort(alone, kind="stable"):
        if alone[j] >= min_alone or kept.sum() <= max(fewest, 1):
            break
        kept[j] = False
        similarity = np.where(kept, centroids @ centroids[j], -np.inf)
        into[into == j] = int(np.argmax(similarity))
    return into


def disputed(summed: np.ndarray, binary: np.ndarray, run: Run) -> float:
    """The share of a run's frames that some window gave to a cluster that does not talk
    there (`summed`: each cluster's activity summed over the windows, `binary` what it became):
    the windows disagree about who this is."""
    lost = (summed[run.on : run.off] > 0) & ~binary[run.on : run.off]
    return float(lost.any(axis=1).mean())


def reassigned(
    binary: np.ndarray,
    moves: Sequence[tuple[Run, int]],
    centroids: np.ndarray,
    min_alone_s: float,
    fewest: int,
    grid: FrameGrid,
) -> tuple[np.ndarray, np.ndarray]:
    """`binary` [T, k] with each run of `moves` given to its new cluster, then a cluster left
    talking alone for less than `min_alone_s` folded into its most similar one (unit
    `centroids` [k, d]). Returns (binary [T, kept], kept [k] bool); `binary` as it was, every
    cluster kept, when fewer than `fewest` speakers would be left (a hint's lower bound)."""
    after = binary.copy()
    for run, _ in moves:
        after[run.on : run.off, run.speaker] = False
    for run, into in moves:
        after[run.on : run.off, into] = True
    into = fold_quiet_speakers(alone_frames(after) * grid.step_s, centroids, min_alone_s, fewest)
    kept = into == np.arange(len(into))
    if (after.any(axis=0) & kept).sum() < fewest:
        return binary, np.ones(len(into), dtype=bool)
    out = np.zeros_like(after)
    for k, target in enumerate(into):
        out[:, target] |= after[:, k]
    return out[:, kept], kept


def clean_frames(activity: np.ndarray) -> np.ndarray:
    """Bool, shaped as `activity` ([..., speakers], speakers last: a window's local ones or the
    global clusters): the frames where that speaker talks alone."""
    return activity.astype(bool) & (activity.sum(axis=-1, keepdims=True) == 1)


def nearest_middle(mask: np.ndarray, limit: int) -> np.ndarray:
    """[frames] bool: of the frames a window's `mask` keeps, the `limit` nearest the window's
    middle (ties: the earlier frame first); all of them when there are no more than `limit`."""
    kept = np.flatnonzero(mask)
    if len(kept) <= limit:
        return mask.astype(bool)
    distance = np.abs(kept - (len(mask) - 1) / 2)
    nearest = np.zeros(len(mask), dtype=bool)
    nearest[kept[np.argsort(distance, kind="stable")[:limit]]] = True
    return nearest
