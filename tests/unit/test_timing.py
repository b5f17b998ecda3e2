"""Word-timing arithmetic (app/engine/timing.py) against definitions written out slowly here:
DTW, the median filter, word splitting and punctuation merging, segment fitting."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.engine.timing import (
    assign_words,
    dtw,
    frame_levels,
    group_words,
    median_filter,
    start_at_speech,
    words_of_window,
)
from app.engine.tokenizer import Tokenizer
from app.engine.words import Word, split_words
from tests.conftest import model_dir


def slow_dtw_cost(cost: np.ndarray) -> float:
    """The cheapest monotonic path's total, cell by cell (the textbook recurrence)."""
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            total[i, j] = cost[i - 1, j - 1] + min(
                total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
            )
    return float(total[n, m])


@pytest.mark.parametrize("seed", range(6))
def test_dtw_finds_the_cheapest_monotonic_path(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, m = rng.integers(1, 12), rng.integers(1, 40)
    cost = rng.normal(size=(n, m))
    rows, cols = dtw(cost)
    assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (n - 1, m - 1)
    steps = set(zip(np.diff(rows).tolist(), np.diff(cols).tolist(), strict=True))
    assert steps <= {(0, 1), (1, 0), (1, 1)}  # right, down or diagonal, never back
    assert cost[rows, cols].sum() == pytest.approx(slow_dtw_cost(cost), abs=1e-9)


def test_dtw_follows_a_diagonal_of_attention() -> None:
    matrix = np.zeros((5, 50))
    for token, frame in enumerate([3, 12, 20, 31, 44]):
        matrix[token, frame : frame + 4] = 1.0
    rows, cols = dtw(-matrix)
    enters = cols[np.diff(rows, prepend=-1).astype(bool)]
    assert enters.tolist()[1:] == [12, 20, 31, 44]


def test_median_filter_matches_the_definition() -> None:
    x = np.random.default_rng(1).normal(size=(2, 3, 30)).astype(np.float32)
    padded = np.pad(x, [(0, 0), (0, 0), (3, 3)], mode="reflect")
    slow = np.array(
        [
            [[np.median(padded[a, b, j : j + 7]) for j in range(30)] for b in range(3)]
            for a in range(2)
        ]
    )
    np.testing.assert_array_equal(median_filter(x, 7), slow)
    short = x[..., :3]
    assert median_filter(short, 7) is short  # shorter than the half width: left alone


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_folder(model_dir("tiny.en"))


def test_split_words_on_spaces_and_punctuation(tok: Tokenizer) -> None:
    tokens = tok.encode(" And so, my fellow Americans: ask not.")
    words, word_tokens = tok.split_words(tokens, "en")
    assert "".join(words) == " And so, my fellow Americans: ask not."
    assert [t for ts in word_tokens for t in ts] == tokens
    assert words[:3] == [" And", " so", ","]


def test_split_words_keeps_a_multibyte_character_whole(tok: Tokenizer) -> None:
    tokens = tok.encode(" 日本語 ok")  # each kanji spans several byte tokens
    words, word_tokens = tok.split_words(tokens, "ja")
    assert "".join(words) == " 日本語 ok" and all("\ufffd" not in w for w in words)
    assert [t for ts in word_tokens for t in ts] == tokens


def _window_words(tok: Tokenizer, text: str, frames: list[int], n_frames: int = 600):
    """Words from synthetic weights: each token's row attends to `frames[i]`."""
    prefix = 2
    text_tokens = tok.encode(text)
    n = prefix + len(text_tokens) + 1
    weights = np.full((2, n, 1500), 1e-6, np.float32)
    for row, frame in zip(range(prefix - 1, n), frames, strict=False):
        weights[:, row, frame : frame + 5] = 1.0  # wider than the median filter's half
    logprobs = np.log(np.full(n, 0.5, np.float32))
    return words_of_window(tok, "en", text_tokens, weights, logprobs, n_frames, prefix)


def test_words_of_window_spell_the_text_with_punctuation_merged(tok: Tokenizer) -> None:
    text = ' He said, "ask not."'
    n_tokens = len(tok.encode(text))
    words = _window_words(tok, text, [10 + 20 * i for i in range(n_tokens + 1)])
    assert "".join(w.word for w in words) == text
    assert [w.word for w in words] == [" He", " said,", ' "ask', ' not."']
    assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(words))
    assert all(w.start <= w.end for w in words)
    assert words[0].probability == pytest.approx(0.5)


def test_the_one_word_split_gives_the_aligners_words(tok: Tokenizer) -> None:
    """Live passes compare committed text with this split: the same words as the aligner's,
    spaces and punctuation kept, untimed."""
    text = ' He said, "ask not." And so, my fellow Americans.'
    tokens = tok.encode(text)
    split = split_words(tok, tokens, "en")
    timed = _window_words(tok, text, [10 + 10 * i for i in range(len(tokens) + 1)])
    assert [w.word for w in split] == [w.word for w in timed]
    assert [w.tokens for w in split] == [w.tokens for w in timed]
    assert "".join(w.word for w in split) == text
    assert [w.key for w in split[:4]] == ["he", "said", "ask", "not"]
    assert all(w.probability is None and w.peak is None for w in split)
    assert split_words(tok, [], "en") == []


def test_the_word_split_cuts_languages_without_spaces_at_whole_characters() -> None:
    tok = Tokenizer.from_folder(model_dir("base"))
    tokens = tok.encode("我们今天开会。")
    assert [w.word for w in split_words(tok, tokens, "zh")] == ["我们", "今天", "开", "会。"]
    assert [w.word for w in split_words(tok, tokens, "en")] == ["我们今天开会。"]


def test_words_start_where_their_tokens_are_attended(tok: Tokenizer) -> None:
    """The row of token i-1 looks where token i is said: word k starts at the frame its
    predecessor's row enters (the first at the path's start), 20 ms per frame."""
    assert len(tok.encode(" one two three")) == 3
    words = _window_words(tok, " one two three", [5, 50, 100, 150])
    assert [(w.start, w.end) for w in words] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]


def test_assign_words_keeps_each_word_inside_its_segment() -> None:
    words = [
        Word(0.0, 0.3, " a", 1.0, (1,)),
        Word(0.3, 3.0, " b", 1.0, (2,)),  # ran on into the pause after it
        Word(5.0, 5.4, " c", 1.0, (3,)),
    ]
    groups = group_words(words, [2, 1])
    segments, last = assign_words(
        groups, [(10.0, 10.6), (15.0, 15.4)], time_offset=10.0, last_speech=9.9
    )
    assert [[w.word for w in placed] for _, _, placed in segments] == [[" a", " b"], [" c"]]
    # pulled back to the segment's end timestamp, plus at least a median word (0.4 s)
    assert segments[0][2][1].end == pytest.approx(10.7)
    for start, end, placed in segments:
        assert start <= placed[0].start and placed[-1].end <= end
    assert last == segments[-1][1] == 15.4
    assert words[1].end == 3.0  # the window's words are left as they were


def test_a_word_starts_where_the_sound_does() -> None:
    levels = np.full(100, -60.0)
    levels[30:40] = -5.0  # the word's sound, 0.6-0.8 s
    levels[60:70] = -8.0
    words = [Word(0.0, 0.8, " a", 1.0, (1,)), Word(0.8, 1.4, " b", 1.0, (2,))]
    moved = start_at_speech(words, levels)
    assert [w.start for w in moved] == [pytest.approx(0.6), pytest.approx(1.2)]
    quiet_lead = [Word(0.56, 0.8, " c", 1.0, (3,))]  # 80 ms of silence first: kept
    assert start_at_speech(quiet_lead, levels) == quiet_lead


def test_frame_levels_follow_loudness() -> None:
    mel = np.full((80, 200), 0.0, np.float32)  # log10 power -4 everywhere (Whisper's scaling)
    mel[:, 100:120] = 1.0  # 40 dB louder for 0.2 s
    levels = frame_levels(mel)
    assert levels.shape == (100,)
    assert levels[50:60].min() - levels[:40].max() == pytest.approx(40.0, abs=0.01)


def test_group_words_splits_a_windows_words_among_its_segments() -> None:
    words = [
        Word(0, 1, " a", 1.0, (1, 2)),
        Word(1, 2, " b", 1.0, (3,)),
        Word(2, 3, " c", 1.0, (4,)),
        Word(3, 4, " d", 1.0, (5, 6)),
    ]
    names = [[w.word for w in g] for g in group_words(words, [3, 1, 2])]
    assert names == [[" a", " b"], [" c"], [" d"]]
    assert [[w.word for w in g] for g in group_words(words, [6, 0])] == [
        [" a", " b", " c", " d"],
        [],
    ]
