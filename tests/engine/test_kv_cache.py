"""K/V cache strategies on the real models: concat, static and no cache give the same tokens,
for greedy and beam search; sequences end cleanly at the text context; sizes are reported."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.decoding import PrefixMemo, decode
from app.engine.decoding_types import DecodingOptions
from app.engine.kv_cache import (
    GROWTH_CHUNK,
    ConcatCache,
    StaticCache,
    make_cache,
)
from app.runtime.contract import STATIC_PREFILL
from tests.engine.conftest import EARNINGS, JFK, SPANISH, clip, window_cross

MODES = ("concat", "static", "none")


def decode_all_modes(sessions, tok, audio, **options):
    cross = window_cross(sessions, audio)
    return {m: decode(sessions, cross, tok, DecodingOptions(kv_cache=m, **options)) for m in MODES}


@pytest.mark.parametrize("name", [JFK, "1089-134686-0000.flac", EARNINGS])
def test_greedy_tokens_identical_across_cache_modes(tiny_exact, tiny_tok, name):
    results = decode_all_modes(tiny_exact, tiny_tok, clip(name))
    tokens = {m: r.tokens for m, r in results.items()}
    assert len(tokens["concat"]) > 10
    assert tokens["concat"] == tokens["static"] == tokens["none"]
    lps = [r.avg_logprob for r in results.values()]
    assert max(lps) - min(lps) < 1e-3
    nsp = [r.no_speech_prob for r in results.values()]
    assert max(nsp) - min(nsp) < 1e-4


def test_cache_modes_identical_multilingual(base_exact, base_tok):
    # language detected from the first step (no language given), then decoded with timestamps
    results = decode_all_modes(base_exact, base_tok, clip(SPANISH))
    assert {r.language for r in results.values()} == {"es"}
    assert results["concat"].tokens == results["static"].tokens == results["none"].tokens


@pytest.mark.parametrize("name", ["1089-134691-0001.flac"])
def test_beam_search_with_cache_equals_without(tiny_exact, tiny_tok, name):
    results = decode_all_modes(tiny_exact, tiny_tok, clip(name), beam_size=5)
    assert results["concat"].tokens == results["static"].tokens == results["none"].tokens
    greedy = decode(tiny_exact, window_cross(tiny_exact, clip(name)), tiny_tok, DecodingOptions())
    assert results["concat"].sum_logprob >= greedy.sum_logprob - 1e-3 or (
        results["concat"].tokens != greedy.tokens
    )


def test_sequence_reaching_the_text_context_ends_cleanly(tiny, tiny_tok):
    """Prompt (223 tokens) + prefix (214) leave 9 positions of the 448: decoding must stop at
    the text context, before sample_len, without indexing past the static buffer."""
    cross = window_cross(tiny, clip(EARNINGS))
    text = " We are gathered to review the results for the year." * 30
    prompt = tiny_tok.encode(text)[:223]
    prefix = tiny_tok.encode(text)[:214]
    n_ctx = tiny.manifest.dims.n_text_ctx
    results = {}
    for mode in ("concat", "static"):
        options = DecodingOptions(
            kv_cache=mode,
            prompt=tuple(prompt),
            prefix=tuple(prefix),
            sample_len=10,
            without_timestamps=True,
            suppress_tokens=(-1, tiny_tok.eot),
            repetition_guard=False,
        )
        results[mode] = decode(tiny, cross, tiny_tok, options)
    initial = 1 + 223 + 2 + 214  # sot_prev + prompt + [sot, notimestamps] + prefix
    for r in results.values():
        assert r.truncated
        assert r.stats.steps == n_ctx + 1 - initial  # the last token chosen at position 447
        assert len(r.tokens) == r.stats.steps  # sampled tokens; the prefix is not repeated
    assert results["concat"].tokens == results["static"].tokens


def test_cache_sizes(tiny, tiny_tok):
    dims = tiny.manifest.dims
    cross = window_cross(tiny, clip(JFK))
    per_layer_cross = dims.n_heads * dims.n_audio_ctx * dims.head_dim * 4
    cross_bytes = 2 * dims.n_text_layer * per_layer_cross
    tokens = np.array([[tiny_tok.sot, tiny_tok.no_timestamps, 440, 523]], np.int64)

    concat = make_cache("concat", tiny, cross)
    concat.forward(tokens)
    self_per_pos = 2 * dims.n_text_layer * dims.n_heads * dims.head_dim * 4
    held = GROWTH_CHUNK * self_per_pos  # 4 positions filled, one chunk held
    assert concat.cross_nbytes == cross_bytes
    assert concat.self_nbytes == held
    assert concat.nbytes == cross_bytes + held

    # what the call handed the runtime: the 4 tokens' ids, positions, the mask over the held
    # slots + 4, the (empty) held past, the window's cross K/V
    int64 = 8
    assert concat.handed_nbytes == 2 * 4 * int64 + (GROWTH_CHUNK + 4) * int64 + held + cross_bytes

    beams = concat.fork(5)
    assert beams.self_nbytes == 5 * held
    assert beams.cross_nbytes == cross_bytes  # shared, batch 1, not copied per beam
    assert all(a is b for a, b in zip(beams.cross, cross, strict=True))
    beams.forward(np.repeat(np.concatenate([tokens, [[262]]], axis=1), 5, axis=0))
    step = 5 * (2 * int64 + (GROWTH_CHUNK + 1) * int64) + 5 * held + cross_bytes
    assert (beams.calls, beams.handed_nbytes) == (1, step)  # one batch-1 cross for 5 beams

    static = make_cache("static", tiny, cross)
    assert static.self_nbytes == dims.n_text_ctx * self_per_pos  # preallocated
    assert make_cache("none", tiny, cross).self_nbytes == 0


def test_static_and_concat_logits_agree_step_by_step(tiny_exact, tiny_tok):
    cross = window_cross(tiny_exact, clip(JFK))
    seq = [tiny_tok.sot, tiny_tok.no_timestamps, *tiny_tok.encode(" And so my fellow Americans")]
    tokens = np.array([seq], np.int64)
    concat, static = ConcatCache(tiny_exact, cross), StaticCache(tiny_exact, cross)
    a = concat.forward(tokens[:, :3], positions=(0, 1, 2, 0, -1))
    b = static.forward(tokens[:, :3], positions=(0, 1, 2, 0, -1))
    assert a.shape == b.shape == (1, 5, tiny_exact.manifest.dims.n_vocab)
    np.testing.assert_allclose(a, b, atol=2e-3)
    for n in range(4, len(seq) + 1):
        np.testing.assert_allclose(
            concat.forward(tokens[:, :n]), static.forward(tokens[:, :n]), atol=2e-3
        )
    assert concat.length == static.length == len(seq)


def test_long_prefix_is_fed_in_one_call_with_the_same_logits(tiny_exact, tiny_tok):
    """A 100-token prompt goes in one call that computes logits only at the positions asked
    for; they equal the no-cache reference's (which computes every position) wherever they are,
    and the cache then goes on one token at a time."""
    cross = window_cross(tiny_exact, clip(JFK))
    prompt = tiny_tok.encode(" We are gathered to review the results for the year." * 8)[:100]
    seq = [tiny_tok.sot_prev, *prompt, tiny_tok.sot, tiny_tok.no_timestamps]
    tokens = np.array([seq], np.int64)
    positions = (0, 5, 64, len(seq) - 2, -1)
    cache = ConcatCache(tiny_exact, cross)
    got = cache.forward(tokens, positions=positions)
    reference = make_cache("none", tiny_exact, cross).forward(tokens, positions=positions)
    assert got.shape == (1, len(positions), tiny_exact.manifest.dims.n_vocab)
    np.testing.assert_allclose(got, reference, atol=2e-3)
    assert cache.calls == 1 and cache.length == len(seq)
    step = np.concatenate([tokens, [[tiny_tok.encode(" And")[0]]]], axis=1)
    np.testing.assert_allclose(
        cache.forward(step), make_cache("none", tiny_exact, cross).forward(step), atol=2e-3
    )


def test_a_long_prompt_goes_into_the_static_cache_in_padded_chunks(tiny_exact, tiny_tok):
    """A 91-token prompt on the static cache: three calls of `STATIC_PREFILL` tokens (the last
    padded; the shapes a static device compiled) instead of 91 one-token calls, with the
    no-cache reference's logits, then steps of one token on what the chunks left."""
    cross = window_cross(tiny_exact, clip(JFK))
    prompt = tiny_tok.encode(" We are gathered to review the results for the year." * 8)[:100]
    seq = [tiny_tok.sot_prev, *prompt, tiny_tok.sot, tiny_tok.no_timestamps]
    assert len(seq) == 91
    tokens = np.array([seq], np.int64)
    positions = (len(seq) - 2, -1)
    cache = StaticCache(tiny_exact, cross)
    got = cache.forward(tokens, positions=positions)
    reference = make_cache("none", tiny_exact, cross).forward(tokens, positions=positions)
    np.testing.assert_allclose(got, reference, atol=2e-3)
    assert cache.calls == -(-len(seq) // STATIC_PREFILL) == 3 and cache.length == len(seq)
    step = np.concatenate([tokens, [[tiny_tok.encode(" And")[0]]]], axis=1)
    np.testing.assert_allclose(
        cache.forward(step), make_cache("none", tiny_exact, cross).forward(step), atol=2e-3
    )
    assert cache.calls == 4


def test_prefill_is_reused_across_attempts(tiny, tiny_tok):
    cross = window_cross(tiny, clip(JFK))
    memo = PrefixMemo()
    prompt = tuple(tiny_tok.encode(" President Kennedy's inaugural address."))
    first = decode(tiny, cross, tiny_tok, DecodingOptions(prompt=prompt), memo=memo)
    again = decode(tiny, cross, tiny_tok, DecodingOptions(prompt=prompt), memo=memo)
    sampled = decode(
        tiny, cross, tiny_tok, DecodingOptions(prompt=prompt, temperature=0.6, best_of=3), memo=memo
    )
    assert not first.stats.prefill_reused
    assert again.stats.prefill_reused and sampled.stats.prefill_reused
    assert again.tokens == first.tokens  # the memo's prefix cache was not modified by the first
    fresh = decode(tiny, cross, tiny_tok, DecodingOptions(prompt=prompt))
    assert fresh.tokens == first.tokens


def test_cache_is_3x_faster_per_token_at_100_plus_tokens(tiny, tiny_tok):
    """Decoder time per token once the sequence holds 100+ tokens (a 100-token prefix is
    prefilled, then 16 steps are timed): the cache must be at least 3x faster than re-running
    the whole sequence."""
    cross = window_cross(tiny, clip(EARNINGS))
    text = " We are gathered to review the results for the year." * 12
    prefix = tuple(tiny_tok.encode(text)[:100])
    per_token = {}
    for mode in ("concat", "none"):
        options = DecodingOptions(
            kv_cache=mode,
            prefix=prefix,
            sample_len=16,
            suppress_tokens=(-1, tiny_tok.eot),  # exactly 16 steps
            without_timestamps=True,
            repetition_guard=False,
        )
        r = min(
            (decode(tiny, cross, tiny_tok, options) for _ in range(2)),
            key=lambda r: r.stats.decoder_s,
        )
        assert r.stats.steps == 16
        per_token[mode] = r.stats.decoder_s / r.stats.steps
    ms = {m: round(v * 1000, 2) for m, v in per_token.items()}
    print(f"decoder ms/token at 102-118 tokens: {ms}")
    assert per_token["none"] >= 3 * per_token["concat"]


def test_concat_buffers_grow_across_a_chunk_edge_under_beam_reorders(tiny_exact, tiny_tok):
    """Beam rows reordered at every step while the buffers grow past a GROWTH_CHUNK edge: each
    step's logits stay those of the no-cache reference on the reordered sequences."""
    cross = window_cross(tiny_exact, clip(JFK))
    rng = np.random.default_rng(5)
    start = [tiny_tok.sot, tiny_tok.no_timestamps]
    prefix = ConcatCache(tiny_exact, cross)
    prefix.forward(np.array([start], np.int64))
    cache = prefix.fork(3)
    tokens = np.tile(np.array(start, np.int64), (3, 1))
    words = tiny_tok.encode(" and so my fellow Americans ask not what your country can do for you")
    checked = []
    while tokens.shape[1] < GROWTH_CHUNK + 4:
        order = rng.integers(0, 3, size=3)
        cache.reorder(order)
        tokens = np.concatenate([tokens[order], rng.choice(words, size=(3, 1))], axis=1)
        got = cache.forward(tokens)
        if tokens.shape[1] in (8, GROWTH_CHUNK, GROWTH_CHUNK + 1, GROWTH_CHUNK + 4):
            reference = make_cache("none", tiny_exact, cross, 3).forward(tokens)
            np.testing.assert_allclose(got, reference, atol=2e-3)
            checked.append(cache.held)
    assert checked == [GROWTH_CHUNK, GROWTH_CHUNK, 2 * GROWTH_CHUNK, 2 * GROWTH_CHUNK]
    assert prefix.held == GROWTH_CHUNK and prefix.length == 2, "the forked prefix is untouched"
