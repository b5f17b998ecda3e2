"""Local speaker activity of overlapping windows -> global speaker turns (pure, on arrays)."""

from __future__ import annotations

import numpy as np

from app.service.diarize.activity import (
    UNASSIGNED,
    FrameGrid,
    Run,
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

GRID = FrameGrid(step_s=0.1, duration_s=0.1)  # 100 frames per 10 s window
FRAMES = 100


def _windows(talks: list[tuple[int, float, float]], seconds: float, permute: bool):
    """Sliding 10 s windows every 1 s over `seconds` of audio in which global speaker g talks
    from a to b for each (g, a, b); each window lists its speakers in its own local order."""
    starts = np.arange(0.0, seconds - 10.0 + 1e-9, 1.0)
    activity = np.zeros((len(starts), FRAMES, 3), dtype=np.float32)
    clusters = np.full((len(starts), 3), UNASSIGNED)
    for c, t0 in enumerate(starts):
        times = t0 + np.arange(FRAMES) * GRID.step_s + 0.5 * GRID.duration_s
        present = [g for g, a, b in talks if ((times >= a) & (times < b)).any()]
        local = list(dict.fromkeys(present))
        if permute and c % 2:
            local.reverse()
        for s, g in enumerate(local):
            for gg, a, b in talks:
                if gg == g:
                    activity[c, :, s] = np.maximum(activity[c, :, s], (times >= a) & (times < b))
            clusters[c, s] = g
    return activity, clusters, starts


def speaker_turns(activity, clusters, starts, grid: FrameGrid, duration_s: float):
    """Global turns from the windows' local activity and their speakers' clusters."""
    n = int(clusters.max()) + 1
    summed = global_activity(activity, clusters, starts, grid, n)
    return turns(binarize(summed, speaker_count(activity, starts, grid)), grid, duration_s)


def test_turns_follow_each_speaker_whatever_its_local_index() -> None:
    activity, clusters, starts = _windows([(0, 0.0, 8.0), (1, 10.0, 18.0)], 20.0, permute=True)
    turns = speaker_turns(activity, clusters, starts, GRID, 20.0)
    assert [t.speaker for t in turns] == [0, 1]
    assert abs(turns[0].start - 0.05) < 0.11 and abs(turns[0].end - 8.0) < 0.11
    assert abs(turns[1].start - 10.0) < 0.11 and abs(turns[1].end - 18.0) < 0.11


def test_overlapped_speech_gives_both_speakers_a_turn() -> None:
    activity, clusters, starts = _windows([(0, 0.0, 12.0), (1, 10.0, 20.0)], 20.0, permute=False)
    turns = speaker_turns(activity, clusters, starts, GRID, 20.0)
    by = {t.speaker: t for t in turns}
    assert by[0].end > 11.8 and by[1].start < 10.2  # 10..12 s belongs to both


def test_count_is_the_windows_mean_rounded() -> None:
    activity = np.zeros((2, FRAMES, 3), dtype=np.float32)
    activity[0, :, :2] = 1  # window 0 hears two speakers everywhere
    activity[1, :, 0] = 1  # window 1 (starting 1 s later) hears one
    count = speaker_count(activity, np.array([0.0, 1.0]), GRID)
    assert count.shape == (FRAMES + 10,)
    assert (count[:10] == 2).all()  # only window 0
    assert (count[10:FRAMES] == 2).all()  # mean 1.5 rounds to 2 (banker's: rint)
    assert (count[FRAMES:] == 1).all()


def test_a_frame_goes_to_the_most_active_speakers_up_to_the_count() -> None:
    summed = np.array([[0.2, 0.9, 0.5], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    binary = binarize(summed, np.array([1, 2, 2]))
    assert binary.tolist() == [[False, True, False], [False, False, False], [True, False, True]]


def test_clean_frames_are_those_with_one_speaker() -> None:
    activity = np.array([[[1, 0, 0], [1, 1, 0], [0, 0, 1]]], dtype=np.float32)
    assert clean_frames(activity)[0].tolist() == [
        [True, False, False],
        [False, False, False],
        [False, False, True],
    ]


def test_an_embeddings_frames_are_capped_to_those_nearest_the_windows_middle() -> None:
    mask = np.zeros(11, dtype=bool)
    mask[[0, 1, 4, 6, 7, 10]] = True  # the middle is frame 5
    assert np.flatnonzero(nearest_middle(mask, 3)).tolist() == [4, 6, 7]
    assert np.flatnonzero(nearest_middle(mask, 4)).tolist() == [1, 4, 6, 7]
    assert np.flatnonzero(nearest_middle(mask, 5)).tolist() == [0, 1, 4, 6, 7]  # a tie: earlier
    assert nearest_middle(mask, 6).tolist() == mask.tolist()  # no more than the cap: all kept
    assert nearest_middle(mask, 9).tolist() == mask.tolist()


def test_nobody_talking_gives_no_turns_and_turns_stop_at_the_audio_end() -> None:
    activity = np.zeros((3, FRAMES, 3), dtype=np.float32)
    starts = np.array([0.0, 1.0, 2.0])
    assert speaker_turns(activity, np.full((3, 3), UNASSIGNED), starts, GRID, 12.0) == ()
    activity[:, :, 0] = 1
    clusters = np.array([[0, UNASSIGNED, UNASSIGNED]] * 3)
    assert speaker_turns(activity, clusters, starts, GRID, 11.5) == (Turn(0.05, 11.5, 0),)


def test_a_windows_local_speakers_add_to_their_clusters() -> None:
    activity = np.zeros((2, FRAMES, 3), dtype=np.float32)
    activity[0, :50, 0] = 1  # cluster 1
    activity[0, 50:, 1] = 1  # cluster 0
    activity[0, 40:60, 2] = 1  # cluster 1 too: counts once where it overlaps local speaker 0
    activity[1, :, 0] = 1  # window 1 (1 s later): cluster 0 throughout
    clusters = np.array([[1, 0, 1], [0, UNASSIGNED, UNASSIGNED]])
    summed = global_activity(activity, clusters, np.array([0.0, 1.0]), GRID, 2)
    expected = np.zeros((FRAMES + 10, 2))
    expected[:60, 1] = 1
    expected[50:FRAMES, 0] += 1
    expected[10:, 0] += 1
    assert np.array_equal(summed, expected)


def test_alone_frames_count_only_frames_with_one_speaker() -> None:
    binary = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=bool)
    assert alone_frames(binary).tolist() == [2, 1, 0]


def test_a_speaker_that_hardly_talks_alone_joins_the_most_similar_one() -> None:
    centroids = np.array([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8], [0.0, 1.0, 0.0]])
    alone = np.array([30.0, 0.5, 12.0])  # seconds
    assert fold_quiet_speakers(alone, centroids, 2.0, 1).tolist() == [0, 2, 2]
    assert fold_quiet_speakers(alone, centroids, 0.0, 1).tolist() == [0, 1, 2]
    assert fold_quiet_speakers(alone, centroids, 2.0, 3).tolist() == [0, 1, 2]  # min_speakers=3


def test_quiet_speakers_fold_quietest_first_and_one_always_stays() -> None:
    centroids = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    assert fold_quiet_speakers(np.array([1.5, 0.2, 1.0]), centroids, 2.0, 1).tolist() == [0, 0, 0]
    assert fold_quiet_speakers(np.array([1.5, 0.2, 1.0]), centroids, 2.0, 2).tolist() == [0, 0, 2]


def test_runs_are_each_clusters_unbroken_stretches_in_time_order() -> None:
    binary = np.array([[1, 0], [1, 1], [0, 1], [1, 0], [1, 0]], dtype=bool)
    assert runs(binary) == (Run(0, 0, 2), Run(1, 1, 3), Run(0, 3, 5))
    assert runs(np.zeros((3, 2), dtype=bool)) == ()


def test_a_moved_run_leaves_its_cluster_and_joins_the_others_frames() -> None:
    binary = np.array([[1, 0], [0, 0], [1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    after, kept = reassigned(binary, [(Run(0, 2, 4), 1)], np.eye(2), 0.0, 1, GRID)
    assert after.tolist() == [[1, 0], [0, 0], [0, 1], [0, 1], [0, 1], [0, 1]]
    assert kept.tolist() == [True, True]
    assert turns(after, GRID, 1.0) == (Turn(0.05, 0.15, 0), Turn(0.25, 0.65, 1))  # one turn
    assert binary[2, 0]  # the input is left as it was


def test_a_cluster_left_too_quiet_by_the_moves_is_dropped_unless_a_hint_needs_it() -> None:
    binary = np.zeros((40, 3), dtype=bool)
    binary[:10, 0] = binary[10:30, 1] = binary[30:, 2] = True
    centroids = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    moves = [(Run(2, 30, 39), 0)]  # cluster 2 keeps one frame: 0.1 s alone
    after, kept = reassigned(binary, moves, centroids, 0.5, 1, GRID)
    assert kept.tolist() == [True, True, False]
    assert after[:, 1].sum() == 21  # its last frame joins the most similar cluster, 1
    assert after[30:39, 0].all()
    emptied = [(Run(2, 30, 40), 0)]
    same, kept = reassigned(binary, emptied, centroids, 0.5, 3, GRID)  # min_speakers=3
    assert kept.tolist() == [True, True, True] and np.array_equal(same, binary)
    after, kept = reassigned(binary, emptied, centroids, 0.5, 2, GRID)
    assert kept.tolist() == [True, True, False] and after[30:, 0].all()


def test_a_run_is_disputed_where_a_window_heard_a_cluster_that_lost_the_frame() -> None:
    summed = np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    binary = np.array([[1, 0, 0], [1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)
    run = Run(0, 0, 4)
    assert disputed(summed, binary, run) == 0.25  # frame 1: cluster 1 heard, lost
    assert disputed(summed, binary, Run(2, 3, 4)) == 0.0  # overlapped speech is no dispute
    assert disputed(summed, np.ones_like(binary), run) == 0.0
