"""Who is who across a live session: the session's speakers as frozen data, and the pure step
that gives an item's speakers their session labels.

Each item (a turn of a live stream) is diarized on its own; its speakers' unit centroids are then
matched to the session's (`SpeakerBook.assigned`): a speaker at least `similarity` (cosine) like a
session speaker is that speaker, best pairs first and one item speaker per session speaker; any
other is a new session speaker, until `max_speakers`, after which it goes to its most similar.
Less than `min_new_s` of speech (REST's `min_alone_s`) is not enough to tell a new voice: such a
speaker goes to its most similar session speaker, whose centroid it does not move.
The whole-file clustering's cut (euclidean 0.7: cosine 0.755) is for embeddings of 5 s windows;
one item can be 2 s of speech, and its embedding is rougher: on 72 pieces of 8 devcorpus
readers, same-speaker pieces of 2 s had cosine 0.49 (5th percentile; 0.63 at 3.5 s), different
speakers at most 0.43 (95th percentile 0.29), hence 0.45. A matched session speaker's centroid
moves toward the item's by the item's share of its speech, so it follows the voice as it is
heard more, and the memory stays one vector per speaker however long the session runs. A session
speaker whose centroid matches an enrolled voice (`known`, cosine at least `known_threshold`) is
labelled with its name, the others `A`, `B`, ... in order of first appearance, never changing
once given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from app.service.diarize.attribution import letters
from app.service.diarize.clustering import normalise


@dataclass(frozen=True, eq=False)
class SpeakerBook:
    """The session's speakers: unit centroids [k, d], seconds heard of each, their labels."""

    centroids: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    seconds: tuple[float, ...] = ()
    labels: tuple[str, ...] = ()
    similarity: float = 0.45
    min_new_s: float = 2.0
    known_threshold: float = 0.5
    max_speakers: int = 8

    def assigned(
        self,
        centroids: np.ndarray,
        seconds: Sequence[float],
        known: Sequence[tuple[str, np.ndarray]] = (),
    ) -> tuple[SpeakerBook, list[str]]:
        """The book after an item whose speakers have these unit `centroids` [m, d] and seconds
        of speech, and each item speaker's label."""
        book, index = self, [-1] * len(centroids)
        if len(book.labels) and len(centroids):
            similarity = centroids @ book.centroids.T  # [item speakers, session speakers]
            taken: set[int] = set()
            for flat in np.argsort(-similarity, axis=None, kind="stable"):
                i, j = divmod(int(flat), similarity.shape[1])
                if similarity[i, j] < book.similarity:
                    break
                if index[i] < 0 and j not in taken:
                    index[i] = j
                    taken.add(j)
        for i, vector in enumerate(centroids):
            if index[i] >= 0:
                book = book._heard(index[i], vector, seconds[i])
            elif len(book.labels) and seconds[i] < book.min_new_s:  # too little to be new
                index[i] = int(np.argmax(book.centroids @ vector))
            elif len(book.labels) < book.max_speakers:
                book = book._added(vector, seconds[i], known)
                index[i] = len(book.labels) - 1
            else:  # no room: the most similar speaker
                index[i] = int(np.argmax(book.centroids @ vector))
                book = book._heard(index[i], vector, seconds[i])
        return book, [book.labels[j] for j in index]

    def _heard(self, j: int, vector: np.ndarray, seconds: float) -> SpeakerBook:
        total = self.seconds[j] + seconds
        weight = seconds / total if total > 0 else 1.0
        centroids = self.centroids.copy()
        centroids[j] = normalise((1 - weight) * centroids[j] + weight * vector)
        times = tuple(t + seconds if k == j else t for k, t in enumerate(self.seconds))
        return replace(self, centroids=centroids, seconds=times)

    def _added(
        self, vector: np.ndarray, seconds: float, known: Sequence[tuple[str, np.ndarray]]
    ) -> SpeakerBook:
        label = self._name(vector, known) or next(
            letter for letter in letters() if letter not in self.labels
        )
        centroids = vector[None, :] if not len(self.labels) else np.vstack([self.centroids, vector])
        return replace(
            self,
            centroids=centroids,
            seconds=(*self.seconds, seconds),
            labels=(*self.labels, label),
        )

    def _name(self, vector: np.ndarray, known: Sequence[tuple[str, np.ndarray]]) -> str | None:
        """The enrolled voice most like `vector` (and not given yet), if one is like enough."""
        best, best_similarity = None, self.known_threshold
        for name, reference in known:
            if name in self.labels:
                continue
            similarity = float(normalise(np.asarray(reference)) @ vector)
            if similarity >= best_similarity:
                best, best_similarity = name, similarity
        return best
