"""Speaker embeddings -> global speakers: agglomerative clustering with pyannote 3.x's rules.

Centroid linkage on L2-normalised embeddings (euclidean), cut at a distance threshold; clusters
smaller than `min_cluster_size` join the nearest large one; a speaker-count hint (exact, minimum or
maximum) moves the cut to the merge whose number of large clusters is nearest the target (among
those, the one whose distance is nearest the threshold). Every embedding then goes to its most
similar centroid. Only the embeddings clean enough to train on are clustered, and at most
`max_train` of them (evenly spaced) so memory and time stay bounded for long files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_SPEAKERS = 20  # largest speaker-count hint accepted


@dataclass(frozen=True)
class SpeakerHints:
    """A request's speaker-count hints (None = no hint); validated against each other."""

    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_speakers", "min_speakers", "max_speakers"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_SPEAKERS:
                raise ValueError(f"{name} must be between 1 and {MAX_SPEAKERS}, got {value}")
        low, high = self.min_speakers or 1, self.max_speakers or MAX_SPEAKERS
        if low > high:
            raise ValueError(f"min_speakers ({low}) must not exceed max_speakers ({high})")
        if self.num_speakers is not None and not low <= self.num_speakers <= high:
            raise ValueError(
                f"num_speakers ({self.num_speakers}) must lie between min_speakers ({low}) "
                f"and max_speakers ({high})"
            )

    def bounds(self, n: int) -> tuple[int, int]:
        """(fewest, most) clusters allowed for `n` embeddings."""
        if self.num_speakers is not None:
            return min(self.num_speakers, n), min(self.num_speakers, n)
        return min(self.min_speakers or 1, n), min(self.max_speakers or MAX_SPEAKERS, n)


@dataclass(frozen=True)
class ClusteringOptions:
    threshold: float = 0.7  # euclidean distance between unit centroids (2 - 2 cos = d^2)
    min_cluster_size: int = 12  # pyannote 3.1's; at most 10 % of the embeddings
    max_train: int = 800
    # two clusters whose centroids are at least this similar (cosine) are one speaker: the
    # linkage above splits a speaker whose windows differ (same-speaker pairs left apart at
    # 0.52-0.74, different speakers at most 0.45, on 30 conversations of unseen speakers:
    # benchmarks/results/live_speakers.md)
    merge_cosine: float = 0.5

    def __post_init__(self) -> None:
        if not (0.0 < self.threshold < 2.0 and self.min_cluster_size >= 1 and self.max_train >= 2):
            raise ValueError(f"invalid clustering options {self}")
        if not -1.0 <= self.merge_cosine <= 1.0:
            raise ValueError(f"invalid clustering options {self}")


@dataclass(frozen=True)
class Clusters:
    """labels: [n] cluster of each embedding (-1: not clustered, a NaN embedding);
    centroids: [k, d] unit vectors."""

    labels: np.ndarray
    centroids: np.ndarray


def normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x, dtype=np.float64), where=norm > 0)


def centroids_of(x: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """[k, d] unit mean of the rows of each cluster 0..k-1 (`flat`: each row's cluster)."""
    return normalise(np.stack([x[flat == c].mean(axis=0) for c in range(int(flat.max()) + 1)]))


def centroid_linkage(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The merges of centroid-linkage clustering of the rows of `x`.

    Returns (pairs [n-1, 2], distances [n-1]): merge m joins slot pairs[m, 1] into slot
    pairs[m, 0] (slots start as the rows); distances are between the two centroids.
    """
    n = len(x)
    sums = x.astype(np.float64).copy()
    sizes = np.ones(n)
    centroids = sums.copy()
    sq = (centroids**2).sum(axis=1)
    d = np.maximum(sq[:, None] + sq[None, :] - 2.0 * centroids @ centroids.T, 0.0)
    np.fill_diagonal(d, np.inf)
    alive = np.ones(n, dtype=bool)
    pairs = np.zeros((max(n - 1, 0), 2), dtype=np.int64)
    distances = np.zeros(max(n - 1, 0))
    for m in range(n - 1):
        i, j = divmod(int(np.argmin(d)), n)
        i, j = min(i, j), max(i, j)
        pairs[m], distances[m] = (i, j), np.sqrt(d[i, j])
        sums[i] += sums[j]
        sizes[i] += sizes[j]
        centroids[i] = sums[i] / sizes[i]
        alive[j] = False
        d[j, :] = d[:, j] = np.inf
        row = ((centroids - centroids[i]) ** 2).sum(axis=1)
        row[~alive] = np.inf
        row[i] = np.inf
        d[i, :] = d[:, i] = row
    return pairs, distances


def labels_after(pairs: np.ndarray, merges: int, n: int) -> np.ndarray:
    """[n] slot label of each row after the first `merges` merges."""
    parent = np.arange(n)
    for i, j in pairs[:merges]:
        parent[j] = i
    for _ in range(n):  # path halving until every row points at a root
        grand = parent[parent]
        if np.array_equal(grand, parent):
            break
        parent = grand
    return parent


def large_counts(pairs: np.ndarray, n: int, min_size: int) -> np.ndarray:
    """[n] number of clusters of at least `min_size` rows after m = 0..n-1 merges."""
    sizes = np.ones(n, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    large = int(min_size <= 1) * n
    counts[0] = large
    for m, (i, j) in enumerate(pairs, start=1):
        large -= int(sizes[i] >= min_size) + int(sizes[j] >= min_size)
        sizes[i] += sizes[j]
        large += int(sizes[i] >= min_size)
        counts[m] = large
    return counts


def choose_merges(
    distances: np.ndarray, counts: np.ndarray, threshold: float, low: int, high: int
) -> int:
    """How many merges to make: all merges up to the first beyond the threshold, unless that
    leaves a number of large clusters outside [low, high]; then the count nearest the bound."""
    above = np.flatnonzero(distances > threshold)
    cut = int(above[0]) if above.size else len(distances)
    if low <= counts[cut] <= high:
        return cut
    target = low if counts[cut] < low else high
    # state m follows merge m-1; state 0 (no merge) sits at distance 0
    at = np.concatenate(([0.0], distances))
    miss = np.abs(counts - target)
    best = np.flatnonzero(miss == miss.min())
    return int(best[np.argmin(np.abs(at[best] - threshold))])


def flat_clusters(x: np.ndarray, hints: SpeakerHints, options: ClusteringOptions) -> np.ndarray:
    """[n] cluster 0..k-1 of each unit row of `x` (small clusters folded into large ones)."""
    n = len(x)
    low, high = hints.bounds(n)
    if n < 2 or high < 2:
        return np.zeros(n, dtype=np.int64)
    min_size = min(options.min_cluster_size, max(1, round(0.1 * n)))
    pairs, distances = centroid_linkage(x)
    counts = large_counts(pairs, n, min_size)
    slots = labels_after(pairs, choose_merges(distances, counts, options.threshold, low, high), n)
    ids, inverse, sizes = np.unique(slots, return_inverse=True, return_counts=True)
    large = np.flatnonzero(sizes >= min_size)
    if large.size == 0:
        return np.zeros(n, dtype=np.int64)
    centroids = centroids_of(x, inverse)
    nearest_large = large[np.argmax(centroids @ centroids[large].T, axis=1)]
    folded = np.where(np.isin(np.arange(len(ids)), large), np.arange(len(ids)), nearest_large)
    return np.unique(folded[inverse], return_inverse=True)[1]


def merged_alike(x: np.ndarray, flat: np.ndarray, min_cosine: float, fewest: int) -> np.ndarray:
    """`flat` (cluster 0..k-1 of each unit row of `x`) with the most similar pair of clusters
    merged while their centroids' cosine is at least `min_cosine` and more than `fewest`
    clusters are left (the hints' lower bound)."""
    while (k := int(flat.max()) + 1 if flat.size else 0) > max(fewest, 1):
        centroids = centroids_of(x, flat)
        similar = centroids @ centroids.T
        np.fill_diagonal(similar, -np.inf)
        i, j = divmod(int(np.argmax(similar)), k)
        if similar[i, j] < min_cosine:
            break
        i, j = min(i, j), max(i, j)
        flat = np.where(flat == j, i, flat)
        flat = np.where(flat > j, flat - 1, flat)
    return flat


def nearer_cluster(similarities: np.ndarray, current: int, margin: float) -> int:
    """The cluster a stretch of speech belongs to, from its own embedding's cosine to each
    centroid: the most similar if it beats the `current` one by at least `margin`."""
    best = int(np.argmax(similarities))
    return best if similarities[best] - similarities[current] >= margin else current


def cluster(
    embeddings: np.ndarray,
    train: np.ndarray,
    hints: SpeakerHints,
    options: ClusteringOptions,
) -> Clusters:
    """Cluster the `train` rows of `embeddings` [n, d], then give every finite row the cluster
    of its most similar centroid."""
    x = normalise(np.nan_to_num(embeddings.astype(np.float64), nan=0.0))
    valid = np.isfinite(embeddings).all(axis=1) & (np.linalg.norm(x, axis=1) > 0)
    rows = np.flatnonzero(train & valid)
    if rows.size == 0:
        rows = np.flatnonzero(valid)
    labels = np.full(len(x), -1, dtype=np.int64)
    if rows.size == 0:
        return Clusters(labels, np.zeros((0, embeddings.shape[1])))
    if rows.size > options.max_train:
        rows = rows[np.linspace(0, rows.size - 1, options.max_train).round().astype(np.int64)]
    trained = x[rows]
    flat = flat_clusters(trained, hints, options)
    flat = merged_alike(trained, flat, options.merge_cosine, hints.bounds(len(trained))[0])
    centroids = centroids_of(trained, flat)
    labels[valid] = np.argmax(x[valid] @ centroids.T, axis=1)
    return Clusters(labels, centroids)
