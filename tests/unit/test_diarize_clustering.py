"""Speaker embeddings -> speakers: agglomerative clustering with count hints (pure, on arrays)."""

from __future__ import annotations

import numpy as np
import pytest

from app.service.diarize.clustering import (
    ClusteringOptions,
    SpeakerHints,
    cluster,
    nearer_cluster,
)

OPTIONS = ClusteringOptions(threshold=0.7, min_cluster_size=12)


def _speakers(sizes: list[int], noise: float = 0.25, seed: int = 0):
    """Embeddings of len(sizes) speakers (a random direction each, plus noise) and the truth."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((len(sizes), 64))
    truth = np.repeat(np.arange(len(sizes)), sizes)
    x = centres[truth] / np.linalg.norm(centres[truth], axis=1, keepdims=True)
    x = x + noise * rng.standard_normal(x.shape) / np.sqrt(64)
    order = rng.permutation(len(truth))
    return x[order], truth[order]


def _same_partition(labels: np.ndarray, truth: np.ndarray) -> bool:
    pairs = {(int(a), int(b)) for a, b in zip(labels, truth, strict=True)}
    return len(pairs) == len(set(labels.tolist())) == len(set(truth.tolist()))


def test_three_speakers_become_three_clusters() -> None:
    x, truth = _speakers([40, 30, 20])
    found = cluster(x, np.ones(len(x), bool), SpeakerHints(), OPTIONS)
    assert _same_partition(found.labels, truth)
    assert found.centroids.shape == (3, 64)
    assert np.allclose(np.linalg.norm(found.centroids, axis=1), 1.0)


def test_one_speaker_stays_one_cluster() -> None:
    x, _ = _speakers([50])
    assert set(cluster(x, np.ones(len(x), bool), SpeakerHints(), OPTIONS).labels) == {0}


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        (SpeakerHints(num_speakers=2), 2),
        (SpeakerHints(max_speakers=2), 2),
        (SpeakerHints(num_speakers=1), 1),
        (SpeakerHints(min_speakers=2, max_speakers=5), 3),
    ],
)
def test_count_hints_move_the_cut(hints: SpeakerHints, expected: int) -> None:
    x, _ = _speakers([40, 30, 20])
    labels = cluster(x, np.ones(len(x), bool), hints, OPTIONS).labels
    assert len(set(labels.tolist())) == expected


def test_min_speakers_splits_two_close_voices() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(64)
    b = a + 0.45 * np.linalg.norm(a) * _unit(rng.standard_normal(64))  # cosine ~0.9
    truth = np.repeat([0, 1], 30)
    x = np.stack([a, b])[truth]
    x = _unit(x) + 0.05 * rng.standard_normal(x.shape) / 8
    assert set(cluster(x, np.ones(60, bool), SpeakerHints(), OPTIONS).labels) == {0}
    labels = cluster(x, np.ones(60, bool), SpeakerHints(min_speakers=2), OPTIONS).labels
    assert _same_partition(labels, truth)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_a_forced_merge_joins_the_two_closest_speakers() -> None:
    x, truth = _speakers([40, 30, 20])
    x[truth == 2] = x[truth == 1][:20] * 0.3 + x[truth == 2] * 0.7  # speaker 2 near speaker 1
    labels = cluster(x, np.ones(len(x), bool), SpeakerHints(num_speakers=2), OPTIONS).labels
    assert len(set(labels[truth == 1].tolist()) | set(labels[truth == 2].tolist())) == 1
    assert set(labels[truth == 0].tolist()).isdisjoint(labels[truth == 1].tolist())


def test_a_few_stray_embeddings_join_a_large_cluster() -> None:
    x, _ = _speakers([40, 40, 2])
    labels = cluster(x, np.ones(len(x), bool), SpeakerHints(), OPTIONS).labels
    assert len(set(labels.tolist())) == 2


def test_untrained_and_missing_rows_are_assigned_or_left_out() -> None:
    x, truth = _speakers([30, 30])
    train = np.arange(len(x)) % 3 != 0  # a third never trains the clustering
    x[5] = np.nan
    found = cluster(x, train, SpeakerHints(), OPTIONS)
    assert found.labels[5] == -1
    keep = np.arange(len(x)) != 5
    assert _same_partition(found.labels[keep], truth[keep])


def test_long_files_cluster_a_bounded_sample() -> None:
    x, truth = _speakers([1500, 1000, 500])
    found = cluster(x, np.ones(len(x), bool), SpeakerHints(), ClusteringOptions(max_train=300))
    assert _same_partition(found.labels, truth)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_speakers": 0},
        {"max_speakers": 21},
        {"min_speakers": 3, "max_speakers": 2},
        {"num_speakers": 5, "max_speakers": 4},
    ],
)
def test_bad_hints_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SpeakerHints(**kwargs)


def _two_groups(cosine: float, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Two tight groups of 40 embeddings whose centres have `cosine` between them."""
    rng = np.random.default_rng(seed)
    a = _unit(rng.standard_normal(64))
    ortho = rng.standard_normal(64)
    ortho = _unit(ortho - (ortho @ a) * a)
    b = cosine * a + np.sqrt(1 - cosine**2) * ortho
    truth = np.repeat([0, 1], 40)
    x = np.stack([a, b])[truth] + 0.05 * rng.standard_normal((80, 64)) / 8
    return x, truth


def test_a_speaker_the_linkage_split_is_merged_back() -> None:
    """One speaker's windows in two groups 0.65 apart (cosine; the linkage joins at 0.755 and
    leaves them apart: seen on real conversations at 0.52-0.74) are one speaker; different
    speakers (at most 0.45 on the same conversations) stay apart; a count hint still rules."""
    split, _ = _two_groups(0.65)
    assert set(cluster(split, np.ones(80, bool), SpeakerHints(), OPTIONS).labels) == {0}
    kept = cluster(split, np.ones(80, bool), SpeakerHints(min_speakers=2), OPTIONS).labels
    assert len(set(kept.tolist())) == 2
    apart, truth = _two_groups(0.4)
    labels = cluster(apart, np.ones(80, bool), SpeakerHints(), OPTIONS).labels
    assert _same_partition(labels, truth)


def test_a_stretch_changes_cluster_only_when_clearly_nearer_another() -> None:
    similarities = np.array([0.25, 0.9, 0.1])
    assert nearer_cluster(similarities, 0, 0.2) == 1  # 0.65 nearer cluster 1
    assert nearer_cluster(similarities, 1, 0.2) == 1  # already the nearest
    assert nearer_cluster(np.array([0.5, 0.6]), 0, 0.2) == 0  # 0.1 nearer: not clear enough
    assert nearer_cluster(np.array([0.5, 0.75]), 0, 0.25) == 1  # the margin itself is enough
