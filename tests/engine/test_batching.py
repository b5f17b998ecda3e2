"""Cross-request batching on the real tiny.en graphs: concurrent transcriptions through one
`BatchingSessions` give the same text as one at a time, sequences join and leave mid-decode, a
cancelled request frees its row, and the scheduler really batched (rows per step > 1)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from app.service.batching import BatchingOptions, BatchingSessions, CrossKV, StepRecord
from app.service.transcriber import Transcriber, TranscriptionCancelled, TranscriptionOptions
from tests.engine.conftest import EARNINGS, JFK, clip

GREEDY = TranscriptionOptions(beam_size=None, best_of=None)
BEAM = TranscriptionOptions(beam_size=3)


@pytest.fixture
def batched(tiny) -> Iterator[BatchingSessions]:
    scheduler = BatchingSessions(tiny, BatchingOptions(max_rows=8), name="test")
    records: list[StepRecord] = []
    scheduler.add_observer(records.append)
    scheduler.records = records  # type: ignore[attr-defined]
    yield scheduler
    scheduler.close()


def text_of(transcriber: Transcriber, audio: np.ndarray, options: TranscriptionOptions) -> str:
    segments, _ = transcriber.transcribe(audio, options)
    return " ".join(s.text.strip() for s in segments)


def test_concurrent_requests_equal_one_at_a_time(tiny_tr, tiny_tok, batched) -> None:
    jobs = [(EARNINGS, GREEDY), (JFK, GREEDY), (EARNINGS, GREEDY), (JFK, BEAM), (JFK, GREEDY)]
    expected = [text_of(tiny_tr, clip(name), opts) for name, opts in jobs]
    transcriber = Transcriber(batched, tiny_tok)
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: text_of(transcriber, clip(job[0]), job[1]), jobs))
    assert got == expected
    steps = [r for r in batched.records if r.kind == "decode"]
    assert max(r.calls for r in steps) >= 3, "several requests shared a decoder call"
    assert batched.stats.mean_rows_per_step > 1.5
    assert all(r.rows <= 8 for r in steps)


def test_rows_join_and_leave_mid_decode(tiny_tr, tiny_tok, batched) -> None:
    """A short request joins while a long one decodes and leaves before it ends."""
    long_expected = text_of(tiny_tr, clip(EARNINGS), GREEDY)
    short_expected = text_of(tiny_tr, clip(JFK), GREEDY)
    transcriber = Transcriber(batched, tiny_tok)
    tokens_seen = threading.Event()
    deltas: list[str] = []

    def long_job() -> str:
        def on_delta(text: str) -> None:
            deltas.append(text)
            tokens_seen.set()

        segments, _ = transcriber.transcribe(clip(EARNINGS), GREEDY, on_delta=on_delta)
        return " ".join(s.text.strip() for s in segments)

    with ThreadPoolExecutor(2) as pool:
        long_future = pool.submit(long_job)
        assert tokens_seen.wait(60), "the long request streamed nothing"
        joined_at = len(batched.records)
        short = pool.submit(text_of, transcriber, clip(JFK), GREEDY).result(60)
        left_at = len(batched.records)
        assert not long_future.done(), "the long request was still decoding when the short left"
        long_text = long_future.result(120)
    assert (short, long_text) == (short_expected, long_expected)
    during = [r for r in batched.records[joined_at:left_at] if r.kind == "decode"]
    after = [r for r in batched.records[left_at:] if r.kind == "decode"]
    assert any(r.calls == 2 for r in during), "the short request joined the running decode"
    assert after and all(r.calls == 1 for r in after), "after leaving, the long one runs alone"


def test_cancelled_request_frees_its_row(tiny_tr, tiny_tok, batched) -> None:
    expected = text_of(tiny_tr, clip(EARNINGS), GREEDY)
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
    assert batched._slab is not None and batched._slab.used == 0, "every window slot is free"


def test_windows_live_in_slab_slots(tiny, batched) -> None:
    """Encoded windows are slab views (no copy per step), and dropping one frees its slot."""
    features = np.zeros((1, tiny.manifest.dims.n_mels, 3000), np.float32)
    first = batched.encode(features)
    second = batched.encode(features)
    assert isinstance(first, CrossKV) and isinstance(second, CrossKV)
    assert (first.slot, second.slot) == (0, 1)
    assert np.shares_memory(first[0], batched._slab.arrays[0])
    reference = tiny.encode(features)
    np.testing.assert_allclose(first[0], reference[0], atol=1e-5)
    del first
    gc.collect()
    third = batched.encode(features)
    assert third.slot == 0, "the freed slot is reused first"
