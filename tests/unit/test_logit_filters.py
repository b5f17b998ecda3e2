"""Logit filters on plain numpy logits (no model): Whisper's suppression and timestamp rules."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.logit_filters import (
    ApplyTimestampRules,
    RepetitionGuard,
    SuppressBlank,
    SuppressTokens,
    find_loop,
    log_softmax,
    logsumexp_rows,
)

# a toy vocabulary laid out like Whisper's: text < EOT < specials < NO_TS < timestamps
V = 40
EOT = 20
SOT = 21
NO_TS = 25
TS = 26  # <|0.00|>; TS + i = i * 0.02 s
BEGIN = 2  # sample_begin: tokens [SOT, x] are the initial tokens


def rules(max_initial: int | None = 5) -> ApplyTimestampRules:
    return ApplyTimestampRules(
        eot=EOT,
        no_timestamps=NO_TS,
        timestamp_begin=TS,
        sample_begin=BEGIN,
        max_initial_timestamp_index=max_initial,
    )


def seq(*sampled: int) -> np.ndarray:
    return np.asarray([[SOT, 22, *sampled]], dtype=np.int64)


def flat(value: float = 0.0, rows: int = 1) -> np.ndarray:
    return np.full((rows, V), value, dtype=np.float32)


def allowed(logits: np.ndarray, row: int = 0) -> set[int]:
    return set(np.flatnonzero(np.isfinite(logits[row])).tolist())


def test_log_softmax_handles_minus_inf():
    x = np.array([[0.0, -np.inf, np.log(3.0)]], dtype=np.float32)
    out = log_softmax(x)
    assert out[0, 1] == -np.inf
    np.testing.assert_allclose(np.exp(out[0]).sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.exp(out[0, 2]), 0.75, rtol=1e-6)
    rows = np.array([[-np.inf, -np.inf], np.log([1.0, 2.0])], np.float32)
    np.testing.assert_allclose(logsumexp_rows(rows), [-np.inf, np.log(3.0)], rtol=1e-6)


def test_suppress_blank_only_at_the_first_sampled_position():
    f = SuppressBlank([3], EOT, BEGIN)
    logits = flat()
    f.apply(logits, seq())
    assert allowed(logits) == set(range(V)) - {3, EOT}
    logits = flat()
    f.apply(logits, seq(5))
    assert allowed(logits) == set(range(V))


def test_suppress_tokens_always():
    f = SuppressTokens([1, 7, 7, 30])
    logits = flat(rows=2)
    f.apply(logits, np.vstack([seq(4), seq(4)]))
    for row in range(2):
        assert allowed(logits, row) == set(range(V)) - {1, 7, 30}


def test_first_token_is_an_early_timestamp():
    logits = flat()
    rules(max_initial=5).apply(logits, seq())
    assert allowed(logits) == set(range(TS, TS + 6))  # <|0.00|> .. <|0.10|>, never NO_TS
    logits = flat()
    rules(max_initial=None).apply(logits, seq())
    assert allowed(logits) == set(range(TS, V))


def test_after_text_and_a_timestamp_only_a_timestamp_or_eot():
    # <|0.00|> text <|0.06|>: the next token closes the pair (>= <|0.06|>) or ends the text
    logits = flat()
    logits[:, :TS] = 10.0  # text and specials likelier than timestamps: no timestamp forcing
    rules().apply(logits, seq(TS, 4, 5, TS + 3))
    assert allowed(logits) == {EOT, *range(21, NO_TS), *range(TS + 3, V)}


def test_after_a_pair_text_must_follow():
    logits = flat()
    rules().apply(logits, seq(TS, 4, TS + 3, TS + 3))
    got = allowed(logits)
    assert not got & set(range(TS, V))
    assert {0, 4, EOT} <= got


def test_timestamps_never_go_back_and_segments_are_not_empty():
    # <|0.00|> text <|0.06|><|0.06|> text: the closing timestamp must be > <|0.06|>
    logits = flat()
    rules().apply(logits, seq(TS, 4, TS + 3, TS + 3, 7))
    got = allowed(logits)
    assert not got & set(range(TS, TS + 4))
    assert set(range(TS + 4, V)) <= got
    # right after the opening timestamp, text (or EOT) must come, no second timestamp
    logits = flat()
    rules().apply(logits, seq(TS + 2))
    assert not allowed(logits) & set(range(TS, V))


def test_timestamp_is_forced_when_all_timestamps_beat_every_text_token():
    logits = flat(-10.0)
    logits[0, 4] = 0.0  # the best text token
    logits[0, TS + 10 : TS + 14] = -0.5  # each less likely than token 4, together more likely
    rules().apply(logits, seq(TS, 4, 5))
    assert allowed(logits) <= set(range(TS, V))
    # with a single weaker timestamp, text stays allowed
    logits = flat(-10.0)
    logits[0, 4] = 0.0
    logits[0, TS + 10] = -0.5
    rules().apply(logits, seq(TS, 4, 5))
    assert 4 in allowed(logits)


def test_timestamp_forcing_is_decided_per_row():
    """Row 0's timestamps together beat its best text token, row 1's do not: only row 0 is
    forced to a timestamp."""
    logits = flat(-10.0, rows=2)
    logits[:, 4] = 0.0
    logits[0, TS + 10 : TS + 14] = -0.5
    logits[1, TS + 10] = -0.5
    rules().apply(logits, np.vstack([seq(TS, 4, 5), seq(TS, 4, 5)]))
    assert allowed(logits, 0) <= set(range(TS, V))
    assert 4 in allowed(logits, 1)


def test_rules_apply_per_row():
    tokens = np.vstack([seq(TS, 4, 4, TS + 3), seq(TS, 4, TS + 3, TS + 3)])
    logits = flat(rows=2)
    logits[:, :TS] = 10.0
    rules().apply(logits, tokens)
    assert 4 not in allowed(logits, 0) and EOT in allowed(logits, 0)
    assert 4 in allowed(logits, 1) and not allowed(logits, 1) & set(range(TS, V))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ([1] * 40, (1, 32)),
        ([9, 8, 7] + [5, 6] * 16, (2, 16)),
        (list(range(12)) * 3, (12, 3)),
        ([1] * 31, None),  # too short a run
        (list(range(30)) * 2, None),  # period above max_period
        ([5, 6] * 10 + [7], None),  # the loop was broken at the end
    ],
)
def test_find_loop(text, expected):
    assert find_loop(np.asarray(text), 24, 3, 32) == expected


def _reference_loop(text, max_period, min_repeats, min_span):
    """Every period in turn, token by token: the oracle of `find_loop`."""
    n = len(text)
    for period in range(1, max_period + 1):
        need = max(min_repeats, -(-min_span // period))
        span = need * period
        if span <= n and all(text[-1 - i] == text[-1 - i - period] for i in range(span - period)):
            return period, need
    return None


@pytest.mark.parametrize("limits", [(24, 3, 32), (5, 2, 6), (3, 1, 1), (2, 1, 7), (6, 2, 1)])
def test_find_loop_matches_the_token_by_token_reference(limits):
    """Random text ending in a repeated unit (cut or not): the same loop, or none, as checking
    every period token by token."""
    rng = np.random.default_rng(sum(limits))
    for _ in range(2000):
        unit = rng.integers(0, 3, size=int(rng.integers(1, 30))).tolist()
        text = rng.integers(0, 3, size=int(rng.integers(0, 10))).tolist()
        text += unit * int(rng.integers(0, 8))
        if rng.random() < 0.3:
            text = text[: int(rng.integers(0, len(text) + 1))]
        assert find_loop(np.asarray(text, np.int64), *limits) == _reference_loop(text, *limits)


def test_repetition_guard_forces_eot_and_ignores_timestamps():
    guard = RepetitionGuard(eot=EOT, timestamp_begin=TS, sample_begin=BEGIN)
    looping = []
    for i in range(20):  # "<|t|> a b <|t'|>" repeated: the text alone is a loop
        looping += [TS + 2 * i, 4, 5, TS + 2 * i + 1]
    varied = np.random.default_rng(0).integers(0, EOT, size=len(looping)).tolist()
    tokens = np.vstack([seq(*looping), seq(*varied)])
    logits = flat(rows=2)
    guard.apply(logits, tokens)
    assert allowed(logits, 0) == {EOT}
    assert allowed(logits, 1) == set(range(V))


def _reference_rules(logits: np.ndarray, tokens: np.ndarray, max_initial: int | None) -> None:
    """openai/whisper's ApplyTimestampRules, row by row, as the oracle of the array version."""
    logits[:, NO_TS] = -np.inf
    for k in range(tokens.shape[0]):
        sampled = tokens[k, BEGIN:]
        seq_k = sampled.tolist()
        last = len(seq_k) >= 1 and seq_k[-1] >= TS
        penultimate = len(seq_k) < 2 or seq_k[-2] >= TS
        if last:
            if penultimate:
                logits[k, TS:] = -np.inf
            else:
                logits[k, :EOT] = -np.inf
        timestamps = sampled[sampled >= TS]
        if timestamps.size > 0:
            end = int(timestamps[-1]) if last and not penultimate else int(timestamps[-1]) + 1
            logits[k, TS:end] = -np.inf
    if tokens.shape[1] == BEGIN:
        logits[:, :TS] = -np.inf
        if max_initial is not None:
            logits[:, TS + max_initial + 1 :] = -np.inf
    for k in range(tokens.shape[0]):
        ts = logits[k, TS:]
        top = ts.max()
        total = top + np.log(np.exp(ts - top).sum()) if np.isfinite(top) else top
        if total > logits[k, :TS].max():
            logits[k, :TS] = -np.inf


@pytest.mark.parametrize("seed", range(20))
def test_rules_match_the_row_by_row_reference(seed: int) -> None:
    """Random rows of text and timestamps (any lengths, pairs, lone ones, none): the array
    version allows exactly what openai/whisper's row loop allows."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(0, 8))
    rows = []
    for _ in range(6):
        tokens = np.where(
            rng.random(length) < 0.4, rng.integers(TS, V, length), rng.integers(0, EOT, length)
        )
        rows.append([SOT, 22, *tokens.tolist()])
    tokens = np.asarray(rows, np.int64)
    logits = rng.normal(0, 2, (6, V)).astype(np.float32)
    logits[:, TS:] += rng.normal(0, 2, (6, 1)).astype(np.float32)  # some rows favour timestamps
    expected = logits.copy()
    _reference_rules(expected, tokens, 5)
    rules(5).apply(logits, tokens)
    np.testing.assert_array_equal(np.isfinite(logits), np.isfinite(expected))
