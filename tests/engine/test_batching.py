"""Cross-request batching on the real tiny.en graphs: concurrent transcriptions through one
`BatchingSessions` give the same text as one at a time, sequences join and leave mid-decode, a
cancelled request frees its row, and the scheduler really batched (rows per step > 1).

On the fp16 build (`tiny_fp16`), whose rows OpenVINO computes bit-identically however they are
packed; with int8 files a near-tie token may flip with the packing (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from app.engine.decoding import decode
from app.engine.decoding_types import DecodingOptions
from app.runtime.steps import DecoderInputs
from app.service.batching.core_turns import CoreTurns
from app.service.batching.cross_slab import CrossKV
from app.service.batching.pack import (
    DecodeCall,
    EncodeCall,
    InputScratch,
    Layout,
)
from app.service.batching.records import BatchingOptions, StepRecord
from app.service.batching.scheduler import BatchingSessions
from app.service.job_run import JobRun
from app.service.pool import WorkerPool
from app.service.transcription.transcriber import (
    Transcriber,
    TranscriptionCancelled,
    TranscriptionOptions,
)
from tests.engine.conftest import EARNINGS, JFK, clip, window_cross, window_features

GREEDY = TranscriptionOptions(beam_size=None, best_of=None)
BEAM = TranscriptionOptions(beam_size=3)


@pytest.fixture
def batched(tiny_fp16) -> Iterator[BatchingSessions]:
    scheduler = BatchingSessions(tiny_fp16, BatchingOptions(max_rows=8), name="test")
    records: list[StepRecord] = []
    spans: list[tuple[str, float, float]] = []  # (kind, start, end) of every model call

    def observe(record: StepRecord) -> None:
        records.append(record)
        end = time.perf_counter()
        spans.append((record.kind, end - record.seconds, end))

    scheduler.add_observer(observe)
    scheduler.records = records  # type: ignore[attr-defined]
    scheduler.spans = spans  # type: ignore[attr-defined]
    yield scheduler
    scheduler.close()


def text_of(transcriber: Transcriber, audio: np.ndarray, options: TranscriptionOptions) -> str:
    segments, _ = transcriber.transcribe(audio, options)
    return " ".join(s.text.strip() for s in segments)


Alone = Callable[[str, TranscriptionOptions], str]


@pytest.fixture(scope="module")
def alone(tiny_fp16, tiny_tok) -> Alone:
    """A clip's text decoded one at a time (no batching), once per (clip, options) for the
    module: the tests compare batched texts with the same few unbatched ones."""
    transcriber = Transcriber(tiny_fp16, tiny_tok)
    return functools.cache(lambda name, options: text_of(transcriber, clip(name), options))


def test_concurrent_requests_equal_one_at_a_time(tiny_tok, batched, alone: Alone) -> None:
    jobs = [(EARNINGS, GREEDY), (JFK, BEAM), (EARNINGS, GREEDY), (EARNINGS, GREEDY), (JFK, GREEDY)]
    expected = [alone(name, opts) for name, opts in jobs]
    transcriber = Transcriber(batched, tiny_tok)
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: text_of(transcriber, clip(job[0]), job[1]), jobs))
    assert got == expected
    steps = [r for r in batched.records if r.kind == "decode"]
    assert max(r.calls for r in steps) >= 3, "several requests shared a decoder call"
    assert batched.stats.mean_rows_per_step > 1.5
    assert all(r.rows <= 8 for r in steps)
    # both stages on the CPU: encoder calls and decoder steps took turns, never ran at once
    assert isinstance(batched.turns, CoreTurns)
    encodes = [(a, b) for kind, a, b in batched.spans if kind == "encode"]
    others = [(a, b) for kind, a, b in batched.spans if kind != "encode"]
    assert len(encodes) >= 5 and others
    assert not [(e, o) for e in encodes for o in others if e[0] < o[1] and o[0] < e[1]]


def test_transcriptions_hand_their_model_work_on_and_share_steps_from_one_thread(
    tiny_tok, batched, alone: Alone
) -> None:
    """A job's thread starts its transcription and is free at its first model call: with one
    worker thread, three requests still decode together, each with the words it has alone."""
    transcriber = Transcriber(batched, tiny_tok)
    pool = WorkerPool(workers=3, max_queue=0, threads=1)

    def work(_post: object, cancel: threading.Event) -> Future:
        return transcriber.start(transcriber.transcription(clip(EARNINGS), GREEDY, cancel=cancel))

    async def scenario() -> list:
        runs = [JobRun(pool, None, work) for _ in range(3)]
        return [await run.result() for run in runs]

    try:
        results = asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert [" ".join(s.text.strip() for s in segments) for segments, _ in results] == [
        alone(EARNINGS, GREEDY)
    ] * 3
    steps = [r for r in batched.records if r.kind == "decode"]
    assert max(r.calls for r in steps) == 3, "the three shared decoder steps"


def test_rows_join_and_leave_mid_decode(tiny_fp16, tiny_tok, batched) -> None:
    """A short window joins while a long one decodes, and leaves before it ends."""
    options = DecodingOptions()
    expected = {
        name: decode(tiny_fp16, window_cross(tiny_fp16, clip(name)), tiny_tok, options).tokens
        for name in (EARNINGS, JFK)
    }
    long_cross, short_cross = (
        window_cross(batched, clip(EARNINGS)),
        window_cross(batched, clip(JFK)),
    )
    assert len(expected[EARNINGS]) > len(expected[JFK]) + 20
    ten_tokens = threading.Event()
    count = []

    def on_token(_: int) -> None:
        count.append(1)
        if len(count) == 10:
            ten_tokens.set()

    with ThreadPoolExecutor(2) as pool:
        long = pool.submit(decode, batched, long_cross, tiny_tok, options, on_token)
        assert ten_tokens.wait(60), "the long decode did not start"
        joined_at = len(batched.records)
        short = pool.submit(decode, batched, short_cross, tiny_tok, options).result(60)
        left_at = len(batched.records)
        assert not long.done(), "the long decode was still running when the short one left"
        assert (long.result(60).tokens, short.tokens) == (expected[EARNINGS], expected[JFK])
    during = [r for r in batched.records[joined_at:left_at] if r.kind == "decode"]
    after = [r for r in batched.records[left_at:] if r.kind == "decode"]
    assert sum(r.calls == 2 for r in during) >= 5, "the short window joined the long one's steps"
    assert after and all(r.calls == 1 for r in after), "after leaving, the long one runs alone"


def test_a_task_that_needs_a_decode_of_its_own_gets_it_on_the_lane(tiny_fp16, batched) -> None:
    """A decode task whose step asks the backend for another decode (on the decoder lane's own
    thread) is served there and then, unbatched, instead of waiting for the lane forever."""
    cross = window_cross(batched, clip(JFK))
    first = DecoderInputs(
        np.array([[50257]], np.int64), np.array([[0]], np.int64), np.ones((1, 1), np.int64),
        batched.empty_past(), cross,
    )  # fmt: skip
    second = DecoderInputs(
        np.array([[50362]], np.int64), np.array([[0]], np.int64), np.ones((1, 1), np.int64),
        batched.empty_past(), cross,
    )  # fmt: skip
    lanes: list[str] = []

    def task():
        served = yield first
        lanes.append(threading.current_thread().name)
        inner = batched.decode(*second.args())  # from the lane: would wait for itself
        return served, inner

    with ThreadPoolExecutor(1) as pool:
        served, inner = pool.submit(batched.run_steps, task()).result(60)
    assert lanes == ["stt-decode-test"], "the step ran on the decoder lane"
    for got, inputs in ((served, first), (inner, second)):
        np.testing.assert_allclose(got[0], tiny_fp16.decode(*inputs.args())[0], atol=1e-5)


def test_cancelled_request_frees_its_row(tiny_tok, batched, alone: Alone) -> None:
    expected = alone(EARNINGS, GREEDY)
    transcriber = Transcriber(batched, tiny_tok)
    cancel = threading.Event()
    started = threading.Event()

    def cancelled_job() -> None:
        segments, _ = transcriber.transcribe(
            clip(EARNINGS), GREEDY, on_delta=lambda _: started.set(), cancel=cancel
        )
        for _ in segments:
            pass

    with ThreadPoolExecutor(2) as pool:
        victim = pool.submit(cancelled_job)
        survivor = pool.submit(text_of, transcriber, clip(EARNINGS), GREEDY)
        assert started.wait(60)
        cancel.set()
        with pytest.raises(TranscriptionCancelled):
            victim.result(30)
        cancelled_at = len(batched.records)
        assert survivor.result(120) == expected
        del victim  # its exception's traceback holds the cancelled window
    later = [r for r in batched.records[cancelled_at + 1 :] if r.kind == "decode"]
    assert later and all(r.calls == 1 for r in later), "the cancelled row left the batch"
    gc.collect()
    assert batched._encoder.slab is not None and batched._encoder.slab.used == 0, (
        "every window slot is free"
    )


def test_windows_live_in_slab_slots(tiny_fp16, batched) -> None:
    """Encoded windows are slab views (no copy per step), and dropping one frees its slot."""
    features = np.zeros((1, tiny_fp16.manifest.dims.n_mels, 3000), np.float32)
    first = batched.encode(features)
    second = batched.encode(features)
    assert isinstance(first, CrossKV) and isinstance(second, CrossKV)
    assert (first.slot, second.slot) == (0, 1)
    assert np.shares_memory(first[0], batched._encoder.slab.arrays[0])
    reference = tiny_fp16.encode(features)
    np.testing.assert_allclose(first[0], reference[0], atol=1e-5)
    del first
    gc.collect()
    third = batched.encode(features)
    assert third.slot == 0, "the freed slot is reused first"


def test_windows_are_encoded_straight_into_free_slots(tiny_fp16, batched) -> None:
    """Once the first window has sized the slab, the encoder writes each window into its slot
    (no output arrays made and copied per window): the same cross K/V as the encoder's own,
    whether the slots of one encoder call lie side by side or apart."""
    jfk, earnings = (window_features(tiny_fp16, clip(name)) for name in (JFK, EARNINGS))
    expected = {id(jfk): tiny_fp16.encode(jfk), id(earnings): tiny_fp16.encode(earnings)}
    first, second, third = (batched.encode(f) for f in (jfk, earnings, jfk))
    del second  # slot 1 frees: the next two windows go to slots 1 and 3
    gc.collect()
    calls = [EncodeCall(0, 1, features=f) for f in (earnings, jfk)]
    batched._encoder._encode(calls)  # one encoder call for both (as the encoder lane batches them)
    apart = [call.outcome() for call in calls]
    held = [(jfk, first), (jfk, third), (earnings, apart[0]), (jfk, apart[1])]
    assert sorted(h.slot for _, h in held) == [0, 1, 2, 3]
    for features, window in held:
        assert isinstance(window, CrossKV)
        for layer, (got, want) in enumerate(zip(window, expected[id(features)], strict=True)):
            assert np.shares_memory(got, batched._encoder.slab.arrays[layer])
            np.testing.assert_allclose(got, want, atol=1e-4)


def test_the_decoder_lane_takes_turns_with_the_encoder(tiny_fp16, tiny_tok, alone: Alone) -> None:
    """The decoder lane and the encoder lane hold the cores one at a time, and the text equals
    unbatched decoding."""
    jobs = [(EARNINGS, GREEDY), (JFK, GREEDY), (EARNINGS, BEAM)]
    expected = [alone(name, opts) for name, opts in jobs]
    scheduler = BatchingSessions(tiny_fp16, BatchingOptions(max_rows=8), name="turns")
    inside: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    for take in ("encoder", "decoder"):
        original = getattr(scheduler.turns, take)

        @contextlib.contextmanager
        def watched(original=original, kind=take):  # type: ignore[no-untyped-def]
            with original():
                inside.append(kind)
                if len(inside) > 1:
                    overlaps.append(tuple(inside))
                try:
                    yield
                finally:
                    inside.remove(kind)

        setattr(scheduler.turns, take, watched)
    try:
        transcriber = Transcriber(scheduler, tiny_tok)
        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(lambda job: text_of(transcriber, clip(job[0]), job[1]), jobs))
    finally:
        scheduler.close()
    assert got == expected
    assert not overlaps
    assert scheduler.stats.decode_steps > 0 and scheduler.stats.encode_calls >= len(jobs)


def test_kept_input_arrays_carry_nothing_into_the_next_step(tiny_fp16, batched) -> None:
    """A step shaped like the one before (same rows and padded past length) reuses the lane's
    input arrays; a member whose past is shorter than the last step's (left padding where that
    step had real positions) still gets exactly its unbatched logits."""
    dims = tiny_fp16.manifest.dims
    cross = window_cross(tiny_fp16, clip(JFK))
    rng = np.random.default_rng(3)

    def one_token_call(caller: int, past_len: int) -> DecodeCall:
        past = [
            (0.5 * rng.standard_normal((1, dims.n_heads, past_len, dims.head_dim))).astype(
                np.float32
            )
            for _ in range(2 * dims.n_text_layer)
        ]
        inputs = DecoderInputs(
            np.array([[50257 + caller]], np.int64),
            np.array([[past_len]], np.int64),
            np.ones((1, past_len + 1), np.int64),
            past,
            cross,
        )
        return DecodeCall.of(caller, inputs)

    stacked_cross = [np.repeat(c, 2, axis=0) for c in cross]
    scratch = InputScratch()
    first = [one_token_call(1, 128), one_token_call(2, 128)]
    second = [one_token_call(3, 128), one_token_call(4, 64)]  # 64 slots of left padding
    for calls in (first, second):
        batched._decode_group(Layout(calls, [0, 1], 2), stacked_cross, scratch)
        scratch.drop_unused()
        for call in calls:
            alone, _ = tiny_fp16.decode(*call.inputs.args())
            np.testing.assert_allclose(call.result[0], alone, atol=1e-4)
    assert len(scratch._arrays) == 1, "both steps ran in the same kept arrays"
