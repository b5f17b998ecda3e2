"""Token selection (greedy / sampling, beam search) and the final sequence ranker.

Ported from openai/whisper's decoding.py for one audio window: a group of `n` rows (1 for greedy,
`best_of` for sampling, `beam_size` for beam search) decoded together.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.engine.logit_filters import log_softmax_at, logsumexp_rows


class Reorderable(Protocol):
    def reorder(self, beam_indices: Sequence[int] | np.ndarray) -> None: ...


class TokenDecoder(ABC):
    """Chooses the next token of every row."""

    @abstractmethod
    def update(
        self, tokens: np.ndarray, logits: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        """Append one token per row.

        tokens: i64 [n, L]; logits: f32 [n, V] (filters applied); sum_logprobs: f64 [n], updated in
        place. Returns (tokens i64 [n, L + 1], completed: every row/candidate is done).
        """

    @abstractmethod
    def finalize(
        self, tokens: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[list[list[int]], list[float], list[bool]]:
        """Candidate sequences (whole rows, each ending in EOT), their summed log-probs, and
        whether each ended by choosing EOT (False: cut by the length limit)."""

    @abstractmethod
    def pending(self) -> list[Sequence[int]]:
        """Sequences the result may still come from (finished candidates), besides the live rows."""


_SAMPLE_BLOCK = 128  # tokens per block of the two-level inverse CDF


def _last_positive(weights: np.ndarray) -> np.ndarray:
    """Per row of [n, m] (each with an entry > 0), the index of its last entry > 0."""
    return weights.shape[1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)


def sample_rows(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """One token per row drawn from softmax(logits / temperature): i64 [n] from f32 [n, V].

    Inverse-CDF sampling with one uniform number per row, in two levels (blocks of tokens, then
    tokens within the chosen block), so no row needs a cumulative sum over the whole vocabulary;
    a Gumbel-max draw needs V random numbers per row (~5 ms per step for 5 rows). Suppressed
    (-inf) tokens have weight 0 and are never drawn.
    """
    weights = logits / np.float32(temperature)
    np.subtract(weights, weights.max(axis=-1, keepdims=True), out=weights)
    np.exp(weights, out=weights)  # [n, V], max 1
    n, vocab = weights.shape
    starts = np.arange(0, vocab, _SAMPLE_BLOCK)
    block_sums = np.add.reduceat(weights, starts, axis=1)
    block_cdf = np.cumsum(block_sums, axis=1, dtype=np.float64)  # [n, blocks]
    targets = rng.random(n) * block_cdf[:, -1]
    rows = np.arange(n)
    # side="right": the first block (token) whose cumulative weight passes the target has a
    # weight > 0; the last positive one catches a target rounded up to the total
    block = np.minimum(_passed(block_cdf, targets), _last_positive(block_sums))
    below = np.where(block > 0, block_cdf[rows, block - 1], 0.0)
    columns = starts[block, None] + np.arange(_SAMPLE_BLOCK)  # [n, block size]
    inside = np.where(columns < vocab, weights[rows[:, None], np.minimum(columns, vocab - 1)], 0)
    cdf = below[:, None] + np.cumsum(inside, axis=1, dtype=np.float64)
    token = np.minimum(_passed(cdf, targets), _last_positive(inside))
    return starts[block] + token


def _passed(cdf: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row, the entries of a non-decreasing row of `cdf` at or below its target
    (`np.searchsorted(row, target, side="right")`)."""
    return np.count_nonzero(cdf <= targets[:, None], axis=1)


class GreedyDecoder(TokenDecoder):
    """Arg-max at temperature 0; sampling from softmax(logits / T) otherwise (`sample_rows`,
    seeded `rng` per request, so a request is reproducible)."""

    def __init__(self, temperature: float, eot: int, rng: np.random.Generator | None = None):
        self.temperature = temperature
        self.eot = eot
        self.rng = rng if rng is not None else np.random.default_rng()

    def update(
        self, tokens: np.ndarray, logits: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        if self.temperature == 0:
            next_tokens = np.argmax(logits, axis=-1)
        else:
            next_tokens = sample_rows(logits, self.temperature, self.rng)
        rows = np.arange(logits.shape[0])
        current = logits[rows, next_tokens] - logsumexp_rows(logits)  # log-prob of the choice
        running = tokens[:, -1] != self.eot
        sum_logprobs += np.where(running, current, 0.0)
        next_tokens = np.where(running, next_tokens, self.eot)
        tokens = np.concatenate([tokens, next_tokens[:, None].astype(np.int64)], axis=-1)
        completed = bool(np.all(tokens[:, -1] == self.eot))
        return tokens, completed

    def finalize(
        self, tokens: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[list[list[int]], list[float], list[bool]]:
        # make sure every sequence has at least one EOT at the end
        ended = [bool(row[-1] == self.eot) for row in tokens]
        rows = [[*row.tolist(), self.eot] for row in tokens]
        return rows, [float(x) for x in sum_logprobs], ended

    def pending(self) -> list[Sequence[int]]:
        return []


class GroupedSampler(TokenDecoder):
    """Several sampling decoders side by side, each on its own consecutive rows (the fallback
    attempts of one window, each at its temperature, decoded as one batch). Each group draws
    from its own generator, so its rows get the tokens it gives decoding alone; it is done when
    every group is."""

    def __init__(self, groups: Sequence[tuple[GreedyDecoder, int]]):
        self.decoders = [decoder for decoder, _ in groups]
        bounds = np.cumsum([0, *(rows for _, rows in groups)])
        self.slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    def update(
        self, tokens: np.ndarray, logits: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        parts, done = [], True
        for decoder, rows in zip(self.decoders, self.slices, strict=True):
            part, completed = decoder.update(tokens[rows], logits[rows], sum_logprobs[rows])
            parts.append(part)
            done = done and completed
        return np.concatenate(parts, axis=0), done

    def finalize(
        self, tokens: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[list[list[int]], list[float], list[bool]]:
        candidates: list[list[int]] = []
        scores: list[float] = []
        ended: list[bool] = []
        for decoder, rows in zip(self.decoders, self.slices, strict=True):
            c, s, e = decoder.finalize(tokens[rows], sum_logprobs[rows])
            candidates += c
            scores += s
            ended += e
        return candidates, scores, ended

    def pending(self) -> list[Sequence[int]]:
        return []


class BeamSearchDecoder(TokenDecoder):
    """Beam search over `beam_size` rows; collects up to round(beam_size * patience) finished
    candidates before stopping. Reorders the K/V cache rows after each step."""

    def __init__(self, beam_size: int, eot: int, cache: Reorderable, patience: float = 1.0):
        if beam_size < 1:
            raise ValueError("beam_size must be >= 1")
        self.beam_size = beam_size
        self.eot = eot
        self.cache = cache
        self.patience = patience
        self.max_candidates = round(beam_size * patience)
        if self.max_candidates <= 0:
            raise ValueError(f"invalid beam size ({beam_size}) or patience ({patience})")
        self.finished: dict[tuple[int, ...], float] = {}

    def update(
        self, tokens: np.ndarray, logits: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[np.ndarray, bool]:
        n = self.beam_size
        if tokens.shape[0] != n:
            raise ValueError(f"{tokens.shape[0]} rows for beam size {n}")
        k = min(n + 1, logits.shape[-1])
        # step 1: the k best continuations of every beam and their cumulative log-probs
        tops = top_k(logits, k)  # [n, k], best first (log-probs rank as logits do in a row)
        scores = sum_logprobs[:, None] + log_softmax_at(logits, tops)  # f64 [n, k]
        candidates = _Candidates.of(tokens, tops, scores)

        # step 2: the best n unfinished continue; finished ones ranked above the n-th become
        # candidates (openai/whisper's loop, as arrays)
        order = candidates.ranked()
        ended = candidates.token[order] == self.eot
        live = order[~ended][:n]
        cutoff = np.flatnonzero(~ended)[n - 1] if len(live) == n else len(order)
        finished = order[:cutoff][ended[:cutoff]]
        n_live = len(live)
        if n_live < n:  # too few distinct candidates (tiny vocab): fill with dead copies
            live = np.concatenate([live, np.repeat(live[:1], n - n_live)])
        sources = candidates.row[live]
        sum_logprobs[:] = candidates.score[live]
        sum_logprobs[n_live:] = -np.inf
        next_tokens = np.concatenate([tokens[sources], candidates.token[live, None]], axis=1)
        self.cache.reorder(sources.astype(np.intp))
        for c in finished.tolist():
            if len(self.finished) >= self.max_candidates:
                break  # the candidate list is full
            sequence = (*tokens[candidates.row[c]].tolist(), int(candidates.token[c]))
            self.finished[sequence] = float(candidates.score[c])

        completed = len(self.finished) >= self.max_candidates
        return next_tokens, completed

    def finalize(
        self, tokens: np.ndarray, sum_logprobs: np.ndarray
    ) -> tuple[list[list[int]], list[float], list[bool]]:
        sequences = dict(self.finished)
        ended = [True] * len(sequences)
        if len(sequences) < self.beam_size:  # not enough finished: add the live beams, best first
            for j in np.argsort(-sum_logprobs, kind="stable").tolist():
                sequence = (*tokens[j].tolist(), self.eot)
                if sequence not in sequences:
                    ended.append(False)
                sequences[sequence] = float(sum_logprobs[j])
                if len(sequences) >= self.beam_size:
                    break
        return [list(s) for s in sequences], list(sequences.values()), ended

    def pending(self) -> list[Sequence[int]]:
        return list(self.finished)


@dataclass(frozen=True)
class _Candidates:
    """The distinct continuations proposed by one beam step, in proposal order (beam by beam,
    best token first): the beam each extends, its token, its cumulative log-prob, and its
    proposal index (ranking ties go to the earlier proposal).

    Identical beams (at the first step every beam is the prompt) propose the same sequences:
    each is kept once, at its first proposal, with the best score and the first beam that has
    it, as openai/whisper's dict of sequences does."""

    row: np.ndarray  # i64 [C]
    token: np.ndarray  # i64 [C]
    score: np.ndarray  # f64 [C]
    first: np.ndarray  # i64 [C]

    @classmethod
    def of(cls, tokens: np.ndarray, tops: np.ndarray, scores: np.ndarray) -> _Candidates:
        """tokens i64 [n, L] (the beams), tops [n, k] (proposed tokens), scores f64 [n, k]."""
        n, k = tops.shape
        row = np.repeat(np.arange(n), k)
        token = tops.ravel().astype(np.int64)
        score = scores.ravel()
        same = (tokens[:, None, :] == tokens[None, :, :]).all(axis=-1)  # [n, n]
        canonical = same.argmax(axis=1)  # the first beam equal to each beam
        if np.array_equal(canonical, np.arange(n)):
            return cls(row, token, score, np.arange(n * k))
        key = canonical[row] * (int(token.max()) + 1) + token  # one key per distinct sequence
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        best = np.full(len(first), -np.inf)
        np.maximum.at(best, inverse, score)
        winner = np.full(len(first), len(key))
        at_best = np.flatnonzero(score == best[inverse])
        np.minimum.at(winner, inverse[at_best], at_best)
        return cls(row[winner], token[winner], best, first)

    def ranked(self) -> np.ndarray:
        """Candidate indices, best score first (ties: the earlier proposal first)."""
        return np.lexsort((self.first, -self.score))


class MaximumLikelihoodRanker:
    """Picks the candidate with the highest length-normalised log-prob.

    length_penalty None: divide by the length; otherwise by ((5 + length) / 6) ** length_penalty
    (Google NMT's penalty), as in openai/whisper.
    """

    def __init__(self, length_penalty: float | None):
        self.length_penalty = length_penalty

    def scores(self, tokens: Sequence[Sequence[int]], sum_logprobs: Sequence[float]) -> list[float]:
        result = []
        for seq, logprob in zip(tokens, sum_logprobs, strict=True):
            length = len(seq)
            if self.length_penalty is None:
                penalty = float(length) if length else 1.0
            else:
                penalty = ((5 + length) / 6) ** self.length_penalty
            result.append(logprob / penalty)
        return result

    def rank(self, tokens: Sequence[Sequence[int]], sum_logprobs: Sequence[float]) -> int:
        """Index of the best candidate (`tokens` are the sampled tokens without EOT)."""
        return int(np.argmax(self.scores(tokens, sum_logprobs)))


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of every row of float [n, V], best first, all distinct
    (ties: lowest index first; non-finite entries rank below every finite one, lowest index
    first).

    k rounds of arg-max: for a small k over a Whisper-sized vocabulary this is ~10x faster than
    `np.argpartition`. The rounds run on the scores as they are; a row where a pick is not
    finite (fewer than k finite entries: every timestamp but one suppressed, a forced EOT) is
    picked again with its non-finite entries ranked as described.
    """
    if k > scores.shape[-1]:
        raise ValueError(f"k={k} exceeds the {scores.shape[-1]} entries per row")
    out, picked = _top_k_rounds(scores.copy(), k)
    short = ~np.isfinite(picked).all(axis=-1)
    if short.any():
        rows = scores[short]
        # -inf, +inf, nan -> the lowest finite value; picked entries (set to -inf) then rank
        # below every entry not picked
        ranked = np.where(np.isfinite(rows), rows, np.finfo(rows.dtype).min)
        out[short] = _top_k_rounds(ranked, k)[0]
    return out


def _top_k_rounds(work: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k rounds of arg-max over `work` [n, V] (overwritten: each pick becomes -inf): the
    indices [n, k] and the values picked."""
    rows = np.arange(work.shape[0])
    out = np.empty((work.shape[0], k), dtype=np.intp)
    picked = np.empty((work.shape[0], k), dtype=work.dtype)
    for i in range(k):
        best = np.argmax(work, axis=-1)
        out[:, i] = best
        picked[:, i] = work[rows, best]
        work[rows, best] = -np.inf
    return out, picked


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by all sequences (0 for none)."""
    if not sequences:
        return 0
    shortest = min(len(s) for s in sequences)
    first = sequences[0]
    for i in range(shortest):
        t = first[i]
        if any(s[i] != t for s in sequences[1:]):
            return i
    return shortest


def report_stable(
    on_token: Callable[[int], None],
    tokens: np.ndarray,
    decoder: TokenDecoder,
    reported: int,
    eot: int,
) -> int:
    """Send the tokens that became stable (the common prefix of every row and every pending
    candidate; a greedy row's every token) to `on_token`, up to the first EOT; return the new
    count of reported positions."""
    if tokens.shape[0] == 1 and not decoder.pending():
        row = tokens[0]
        stable = row.shape[0]
    else:
        rows: list[Sequence[int]] = [r for r in tokens.tolist()]
        rows.extend(decoder.pending())
        stable = common_prefix_length(rows)
        row = tokens[0]
    for pos in range(reported, stable):
        t = int(row[pos])
        if t == eot:
            return pos
        on_token(t)
    return max(reported, stable)
