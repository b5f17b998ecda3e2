"""Greedy/sampling and beam search logic on a small numpy language model (no Whisper model).

The toy model is a fixed table of next-token log-probabilities indexed by the last token, so
every sequence's probability is known exactly and beam search can be checked by brute force.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.engine.logit_filters import log_softmax
from app.engine.search import (
    BeamSearchDecoder,
    GreedyDecoder,
    MaximumLikelihoodRanker,
    common_prefix_length,
    sample_rows,
    top_k,
)

EOT = 0
V = 5
START = 4


class RowLog:
    """Records the beam reorders a BeamSearchDecoder asks for (stands in for a K/V cache)."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def reorder(self, beam_indices) -> None:
        self.calls.append(list(np.asarray(beam_indices)))


def bigram_table(seed: int) -> np.ndarray:
    """log P(next | last) [V, V]; EOT's row is irrelevant (finished rows stop)."""
    rng = np.random.default_rng(seed)
    return log_softmax(rng.normal(0, 2.0, size=(V, V)).astype(np.float32))


def logits_for(tokens: np.ndarray, table: np.ndarray) -> np.ndarray:
    return table[tokens[:, -1]].copy()


def run(decoder, tokens, table, max_len):
    sum_logprobs = np.zeros(tokens.shape[0])
    for _ in range(max_len):
        tokens, completed = decoder.update(tokens, logits_for(tokens, table), sum_logprobs)
        if completed:
            break
    return decoder.finalize(tokens, sum_logprobs)


def exhaustive_best(table: np.ndarray, max_len: int, ranker: MaximumLikelihoodRanker):
    """Best sequence of at most max_len sampled tokens, by brute force, when the last step may
    only choose EOT (a forced EOT costs nothing: it is the only token left)."""
    best, best_score = None, -np.inf
    for length in range(1, max_len + 1):
        for body in itertools.product(range(1, V), repeat=length - 1):
            seq = [START, *body]
            logprob = sum(table[a, b] for a, b in itertools.pairwise(seq))
            if length < max_len:
                logprob += table[seq[-1], EOT]
            score = ranker.scores([list(body)], [logprob])[0]
            if score > best_score:
                best, best_score = list(body), score
    return best, best_score


def test_greedy_takes_argmax_and_sums_logprobs():
    table = bigram_table(1)
    decoder = GreedyDecoder(0.0, EOT)
    tokens = np.array([[START]], dtype=np.int64)
    candidates, scores, ended = run(decoder, tokens, table, 10)
    seq = candidates[0]
    expected = [START]
    total = 0.0
    while len(expected) < 11 and expected[-1] != EOT:
        nxt = int(np.argmax(table[expected[-1]]))
        total += float(table[expected[-1], nxt])
        expected.append(nxt)
    assert seq[: len(expected)] == expected
    assert seq[-1] == EOT
    np.testing.assert_allclose(scores[0], total, rtol=1e-5)
    assert ended[0] == (expected[-1] == EOT)


def test_greedy_finished_rows_stay_finished():
    decoder = GreedyDecoder(0.0, EOT)
    tokens = np.array([[START, EOT], [START, 2]], dtype=np.int64)
    logits = np.zeros((2, V), np.float32)
    logits[:, 3] = 5.0
    sums = np.zeros(2)
    tokens, completed = decoder.update(tokens, logits, sums)
    assert tokens[:, -1].tolist() == [EOT, 3]
    assert sums[0] == 0.0 and sums[1] < 0
    assert not completed


def test_sampling_is_seeded_and_follows_the_distribution():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4, 1e-9]], dtype=np.float32))
    logits = np.repeat(logits, 4000, axis=0)
    tokens = np.full((4000, 1), START, dtype=np.int64)

    def sample(seed):
        decoder = GreedyDecoder(1.0, EOT, np.random.default_rng(seed))
        out, _ = decoder.update(tokens, logits, np.zeros(4000))
        return out[:, -1]

    a, b = sample(7), sample(7)
    np.testing.assert_array_equal(a, b)
    freq = np.bincount(a, minlength=V) / a.size
    np.testing.assert_allclose(freq[:4], [0.1, 0.2, 0.3, 0.4], atol=0.03)
    assert not np.array_equal(a, sample(8))


def test_sampling_never_picks_suppressed_tokens():
    logits = np.zeros((500, V), np.float32)
    logits[:, 1] = -np.inf
    decoder = GreedyDecoder(1.0, EOT, np.random.default_rng(0))
    out, _ = decoder.update(np.full((500, 1), START), logits, np.zeros(500))
    assert 1 not in out[:, -1]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_beam_search_finds_what_brute_force_finds(seed):
    table = bigram_table(seed)
    max_len = 4
    ranker = MaximumLikelihoodRanker(None)
    best, best_score = exhaustive_best(table, max_len, ranker)
    # with as many beams as there are live sequences, beam search is exhaustive
    beam = (V - 1) ** (max_len - 1)
    decoder = BeamSearchDecoder(beam, EOT, RowLog(), patience=100.0)
    tokens = np.full((beam, 1), START, dtype=np.int64)
    sums = np.zeros(beam)  # identical starting rows, as in the decode loop
    for step in range(max_len):
        logits = logits_for(tokens, table)
        if step == max_len - 1:  # the last step may only end the sequences
            logits[:, 1:] = -np.inf
        tokens, done = decoder.update(tokens, logits, sums)
        if done:
            break
    candidates, scores, ended = decoder.finalize(tokens, sums)
    assert all(ended)
    bodies = [c[1 : c.index(EOT)] for c in candidates]
    chosen = ranker.rank(bodies, scores)
    assert ranker.scores([bodies[chosen]], [scores[chosen]])[0] == pytest.approx(best_score)
    assert bodies[chosen] == best


def test_beam_search_beats_greedy_on_a_garden_path():
    # greedy takes 1 (p=.6), after which nothing is likely (best: EOT, p=.35: .21 in all);
    # 2 (p=.4) leads to a near-sure EOT (.388 in all)
    table = np.full((V, V), 1e-6)
    table[START] = [1e-6, 0.6, 0.4, 1e-6, 1e-6]
    table[1] = [0.35, 0.33, 1e-6, 0.32, 1e-6]
    table[2] = [0.97, 0.01, 0.01, 0.01, 1e-6]
    table[3] = [1.0, 1e-6, 1e-6, 1e-6, 1e-6]
    table = np.log(table / table.sum(axis=1, keepdims=True)).astype(np.float32)
    ranker = MaximumLikelihoodRanker(None)

    greedy, _, _ = run(GreedyDecoder(0.0, EOT), np.array([[START]]), table, 5)
    assert greedy[0][:3] == [START, 1, EOT]

    log = RowLog()
    beam = BeamSearchDecoder(2, EOT, log)
    tokens = np.full((2, 1), START, dtype=np.int64)
    cands, scores, ended = run(beam, tokens, table, 5)
    bodies = [c[1 : c.index(EOT)] for c in cands]
    best = ranker.rank(bodies, scores)
    assert bodies[best] == [2]
    assert all(ended)
    assert log.calls and all(len(c) == 2 for c in log.calls)


def test_beam_reorder_indices_point_at_source_rows():
    log = RowLog()
    decoder = BeamSearchDecoder(2, EOT, log)
    tokens = np.array([[START, 1], [START, 2]], dtype=np.int64)
    logits = np.zeros((2, V), np.float32)  # row 0: uniform, log(1/5) each
    logits[1] = -20.0  # row 1 has both of the best continuations
    logits[1, 3] = 0.0
    logits[1, 4] = -0.1
    new, _ = decoder.update(tokens, logits, np.zeros(2))
    assert log.calls[-1] == [1, 1]
    assert new.tolist() == [[START, 2, 3], [START, 2, 4]]


def test_patience_sets_the_number_of_finished_candidates():
    assert BeamSearchDecoder(5, EOT, RowLog(), patience=1.0).max_candidates == 5
    assert BeamSearchDecoder(5, EOT, RowLog(), patience=2.0).max_candidates == 10
    assert BeamSearchDecoder(4, EOT, RowLog(), patience=0.5).max_candidates == 2
    with pytest.raises(ValueError):
        BeamSearchDecoder(1, EOT, RowLog(), patience=0.1)


def test_finalize_adds_live_beams_when_too_few_finished():
    decoder = BeamSearchDecoder(3, EOT, RowLog())
    decoder.finished = {(START, 1, EOT): -1.0}
    tokens = np.array([[START, 2, 2], [START, 3, 3], [START, 4, 4]], dtype=np.int64)
    cands, scores, ended = decoder.finalize(tokens, np.array([-3.0, -0.5, -2.0]))
    assert cands == [[START, 1, EOT], [START, 3, 3, EOT], [START, 4, 4, EOT]]
    assert scores == [-1.0, -0.5, -2.0]
    assert ended == [True, False, False]


def test_length_penalty():
    ranker = MaximumLikelihoodRanker(None)
    assert ranker.scores([[1, 2], [1, 2, 3, 4]], [-2.0, -3.0]) == [-1.0, -0.75]
    assert ranker.rank([[1, 2], [1, 2, 3, 4]], [-2.0, -3.0]) == 1
    ranker = MaximumLikelihoodRanker(1.0)  # ((5 + n) / 6) ** 1
    np.testing.assert_allclose(ranker.scores([[1], [1, 2, 3, 4, 5, 6, 7]], [-1.0, -2.0]), [-1, -1])
    ranker = MaximumLikelihoodRanker(0.0)  # no normalisation: the raw sum
    assert ranker.rank([[1], [1, 2, 3]], [-1.0, -2.0]) == 0


def test_common_prefix_length():
    assert common_prefix_length([]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 3
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1], [2]]) == 0


def test_top_k_matches_a_full_sort():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 1000)).astype(np.float32)
    x[:, 900:] = -np.inf
    np.testing.assert_array_equal(top_k(x, 6), np.argsort(-x, axis=-1, kind="stable")[:, :6])


def test_top_k_ranks_non_finite_entries_last_by_index():
    """Rows with fewer than k finite entries (a forced EOT, one timestamp left) and ties: the
    finite entries best first, then the non-finite ones lowest index first, all distinct."""
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 3, size=(6, 300)).astype(np.float32)  # many ties
    x[1, :] = -np.inf
    x[1, 7] = 0.0  # one finite entry (a forced EOT)
    x[2, ::2] = -np.inf
    x[2, 1:9:2] = -np.inf  # ... and the finite ones start at 9
    x[3, :] = -np.inf
    x[3, [250, 20]] = [1.0, 2.0]
    x[4, 5] = np.nan
    x[5, 50] = np.inf
    ranked = np.where(np.isfinite(x), x, np.finfo(np.float32).min)
    expected = np.argsort(-ranked, axis=-1, kind="stable")[:, :6]
    np.testing.assert_array_equal(top_k(x, 6), expected)
    assert top_k(x, 6)[1].tolist() == [7, 0, 1, 2, 3, 4]


def _sample_row_by_row(logits, temperature, rng, block=128):
    """The two-level inverse CDF one row at a time (np.searchsorted): the oracle of the array
    version."""
    scaled = logits / np.float32(temperature)
    weights = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    starts = np.arange(0, weights.shape[-1], block)
    block_sums = np.add.reduceat(weights, starts, axis=1)
    block_cdf = np.cumsum(block_sums, axis=1, dtype=np.float64)
    targets = rng.random(len(weights)) * block_cdf[:, -1]
    chosen = []
    for row, target in enumerate(targets):
        last = int(np.flatnonzero(block_sums[row] > 0)[-1])
        b = min(int(np.searchsorted(block_cdf[row], target, side="right")), last)
        inside = weights[row, starts[b] : starts[b] + block]
        cdf = (block_cdf[row, b - 1] if b else 0.0) + np.cumsum(inside, dtype=np.float64)
        last = int(np.flatnonzero(inside > 0)[-1])
        chosen.append(starts[b] + min(int(np.searchsorted(cdf, target, side="right")), last))
    return np.asarray(chosen)


@pytest.mark.parametrize("vocab", [51864, 300, 128, 5])
def test_sampling_draws_what_the_row_by_row_draw_gives(vocab):
    """Same generator, same tokens as drawing each row alone (ragged last block, most tokens
    suppressed, sharp and flat temperatures)."""
    rng = np.random.default_rng(vocab)
    for _ in range(40):
        n = int(rng.integers(1, 26))
        logits = (rng.standard_normal((n, vocab)) * rng.choice([1, 5, 20])).astype(np.float32)
        logits[rng.random((n, vocab)) < rng.choice([0.0, 0.5, 0.99])] = -np.inf
        logits[np.arange(n), rng.integers(0, vocab, n)] = 0.0  # a finite entry in every row
        temperature, seed = float(rng.choice([0.2, 0.6, 1.0])), int(rng.integers(1 << 30))
        drawn = sample_rows(logits, temperature, np.random.default_rng(seed))
        expected = _sample_row_by_row(logits, temperature, np.random.default_rng(seed))
        np.testing.assert_array_equal(drawn, expected)


def test_sampling_temperature_sharpens_and_trailing_suppressed_tokens_stay_out():
    probs = np.array([0.2, 0.3, 0.5], dtype=np.float32)
    logits = np.full((6000, V), -np.inf, np.float32)
    logits[:, :3] = np.log(probs)  # every later token, the last one included, is suppressed
    decoder = GreedyDecoder(0.5, EOT, np.random.default_rng(3))
    out, _ = decoder.update(np.full((6000, 1), START), logits, np.zeros(6000))
    freq = np.bincount(out[:, -1], minlength=V) / 6000
    sharpened = probs**2 / (probs**2).sum()  # softmax(log p / 0.5)
    np.testing.assert_allclose(freq[:3], sharpened, atol=0.03)
    assert freq[3:].sum() == 0


def vocab_of(logits: np.ndarray) -> int:
    return logits.shape[-1]


class DictBeamSearch:
    """openai/whisper's beam step (a dict of candidate sequences, loops over beams): the
    reference the array version must reproduce, step by step."""

    def __init__(self, beam_size: int, patience: float = 1.0) -> None:
        self.beam_size = beam_size
        self.max_candidates = round(beam_size * patience)
        self.finished: dict[tuple[int, ...], float] = {}
        self.reorders: list[list[int]] = []

    def update(self, tokens, logits, sum_logprobs):
        logprobs = log_softmax(logits)
        scores: dict[tuple[int, ...], float] = {}
        sources: dict[tuple[int, ...], int] = {}
        for j in range(self.beam_size):
            prefix = tuple(tokens[j].tolist())
            for token in top_k(logprobs, min(self.beam_size + 1, vocab_of(logits)))[j].tolist():
                sequence = (*prefix, token)
                score = float(sum_logprobs[j] + logprobs[j, token])
                if sequence not in scores or score > scores[sequence]:
                    scores[sequence], sources[sequence] = score, j
        kept: list[tuple[int, ...]] = []
        rows: list[int] = []
        newly: dict[tuple[int, ...], float] = {}
        for sequence in sorted(scores, key=scores.__getitem__, reverse=True):
            if sequence[-1] == EOT:
                newly[sequence] = scores[sequence]
            else:
                sum_logprobs[len(kept)] = scores[sequence]
                kept.append(sequence)
                rows.append(sources[sequence])
                if len(kept) == self.beam_size:
                    break
        while len(kept) < self.beam_size:
            sum_logprobs[len(kept)] = -np.inf
            kept.append(kept[0])
            rows.append(rows[0])
        self.reorders.append(rows)
        for sequence in sorted(newly, key=newly.__getitem__, reverse=True):
            if len(self.finished) >= self.max_candidates:
                break
            self.finished[sequence] = newly[sequence]
        return np.asarray(kept, dtype=np.int64), len(self.finished) >= self.max_candidates


@pytest.mark.parametrize(
    ("seed", "beam", "vocab", "patience"),
    [(0, 5, 300, 1.0), (1, 5, 300, 2.0), (2, 3, 40, 1.0), (3, 2, 3, 1.0), (4, 4, 4, 1.0)],
)
def test_beam_step_equals_the_dict_reference(seed, beam, vocab, patience):
    """Same beams, reorders, scores and finished candidates as openai/whisper's loop, every step:
    identical starting rows, ties (logits rounded to a coarse grid), suppressed tokens, EOT
    often, and a vocabulary so small that dead copies fill the beams."""
    rng = np.random.default_rng(seed)
    log = RowLog()
    ours = BeamSearchDecoder(beam, EOT, log, patience=patience)
    reference = DictBeamSearch(beam, patience)
    tokens = np.full((beam, 2), START % vocab, dtype=np.int64)  # identical rows, as the loop has
    ref_tokens = tokens.copy()
    sums, ref_sums = np.zeros(beam), np.zeros(beam)
    for _ in range(12):
        logits = np.round(rng.normal(0, 2.0, size=(beam, vocab)), 1).astype(np.float32)
        logits[:, EOT] += 1.0  # candidates finish often
        logits[:, rng.integers(0, vocab, size=vocab // 10)] = -np.inf
        for j in range(1, beam):  # equal rows see equal logits (as equal K/V give)
            equal = np.flatnonzero((tokens[:j] == tokens[j]).all(axis=1))
            if len(equal):
                logits[j] = logits[equal[0]]
        tokens, done = ours.update(tokens, logits.copy(), sums)
        ref_tokens, ref_done = reference.update(ref_tokens, logits.copy(), ref_sums)
        np.testing.assert_array_equal(tokens, ref_tokens)
        np.testing.assert_array_equal(sums, ref_sums)
        assert log.calls[-1] == reference.reorders[-1]
        assert ours.finished == reference.finished
        assert done == ref_done
        if done:
            break
