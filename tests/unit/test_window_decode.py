"""The one window decode's plans (`app.service.transcription.window_decode.WindowPlan`): how a
file window and a live pass are judged and streamed, as data; decoding results in, verdicts out;
no model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from app.engine.decoding_types import DecodingResult
from app.service.live.options import StreamingOptions
from app.service.live.window_pass import pass_plan
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.window_decode import TOGETHER_KV_BYTES, file_plan, rows_within

TS = 50363  # <|0.00|> of the English-only models
PREFIX = (TS, 1, 2, TS + 50)  # a committed segment, forced with its timestamps
FILE = file_plan(TranscriptionOptions(), "en", (), None)
LIVE = StreamingOptions(language="en")


def result(no_speech: float, logprob: float, text: str = " Thank you.", *,
           looped: bool = False) -> DecodingResult:  # fmt: skip
    return DecodingResult(
        tokens=(1, 2), text=text, avg_logprob=logprob, sum_logprob=3 * logprob,
        no_speech_prob=no_speech, temperature=0.0, compression_ratio=1.2, language="en",
        looped=looped,
    )  # fmt: skip


SILENT = result(0.9, -1.2)  # Whisper's rule: probably silent and not confident
LOOP = result(0.1, -0.2, looped=True)


def test_a_file_window_tries_every_temperature_of_its_options() -> None:
    plan = file_plan(TranscriptionOptions(temperature=(0.0, 0.4), beam_size=5), "de", (7,), "Hi")
    assert [a.temperature for a in plan.attempts] == [0.0, 0.4]
    assert [a.beam_size for a in plan.attempts] == [5, None]  # beams at 0, samples above
    assert {(a.language, a.prompt, a.prefix) for a in plan.attempts} == {("de", (7,), "Hi")}


@pytest.mark.parametrize(
    ("temperatures", "batches"),
    [
        ((0.0, 0.2, 0.4, 0.6, 0.8, 1.0), ((0,), (1, 2, 3, 4, 5))),  # the default schedule
        ((0.0,), ((0,),)),
        ((0.0, 0.5), ((0,), (1,))),  # one attempt left: alone
        ((0.0, 0.5, 1.0), ((0,), (1, 2))),
        ((0.2, 0.4, 0.6), ((0,), (1, 2))),
        ((0.3, 0.6, 0.9, 1.0), ((0,), (1, 2, 3))),
    ],
)
def test_the_attempts_after_the_first_run_as_one_decode(
    temperatures: tuple[float, ...], batches: tuple[tuple[int, ...], ...]
) -> None:
    plan = file_plan(TranscriptionOptions(temperature=temperatures), "en", (), None)
    assert plan.batches() == batches


@pytest.mark.parametrize(
    ("max_rows", "batches"),
    [
        (25, ((0,), (1, 2, 3, 4, 5))),  # best_of 5: 25 rows fit
        (15, ((0,), (1, 2, 3), (4, 5))),
        (9, ((0,), (1,), (2,), (3,), (4,), (5,))),  # one attempt's 5 rows at a time
        (3, ((0,), (1,), (2,), (3,), (4,), (5,))),  # an attempt alone may exceed the bound
    ],
)
def test_attempts_run_together_within_a_row_bound(
    max_rows: int, batches: tuple[tuple[int, ...], ...]
) -> None:
    assert FILE.batches(max_rows) == batches


@pytest.mark.parametrize(
    ("dims", "kv_dtype", "rows"),
    [
        ((4, 6, 448, 64), np.float16, 97),  # tiny.en, 16-bit K/V: 2.6 MiB a row
        ((4, 6, 448, 64), np.float32, 48),  # ... f32 K/V
        ((4, 20, 448, 64), np.float16, 29),  # large-v3-turbo
        ((32, 20, 448, 64), np.float16, 3),  # large-v3: 70 MiB a row
    ],
)
def test_rows_within_a_budget_follow_the_self_kv_size(dims, kv_dtype, rows) -> None:
    layers, heads, ctx, head_dim = dims
    sessions = SimpleNamespace(
        manifest=SimpleNamespace(
            dims=SimpleNamespace(
                n_text_layer=layers, n_heads=heads, n_text_ctx=ctx, head_dim=head_dim
            )
        ),
        kv_dtype=np.dtype(kv_dtype),
    )
    assert rows_within(TOGETHER_KV_BYTES, sessions) == rows


def test_a_file_window_may_be_judged_silent_and_keeps_a_loop() -> None:
    assert FILE.verdict(SILENT, 30.0) == "silent"
    assert FILE.verdict(result(0.9, -0.5), 30.0) == "speech"  # confident: speech
    assert FILE.verdict(LOOP, 30.0) == "speech"  # the best its attempts gave is still text


def test_a_live_pass_with_a_forced_prefix_is_never_judged_silent() -> None:
    forced = pass_plan(LIVE, "en", (), PREFIX)
    assert forced.verdict(SILENT, 3.0) == "speech"
    assert forced.attempts[0].max_initial_timestamp is None  # the prefix placed the first
    free = pass_plan(LIVE, "en", (), ())
    assert free.verdict(SILENT, 3.0) == "silent"
    assert free.attempts[0].max_initial_timestamp == 1.0


def test_a_live_pass_is_one_greedy_attempt_and_a_loop_is_no_text() -> None:
    plan = pass_plan(LIVE, None, (5, 6), PREFIX)
    (attempt,) = plan.attempts
    assert (attempt.temperature, attempt.beam_size, attempt.best_of) == (0.0, None, None)
    assert (attempt.prompt, attempt.prefix, attempt.language) == ((5, 6), PREFIX, None)
    assert plan.verdict(LOOP, 3.0) == "looped"
    assert pass_plan(LIVE, "en", (), ()).verdict(LOOP, 3.0) == "looped"


@pytest.mark.parametrize(
    ("attempt", "no_speech", "file", "live"),
    [
        (0, 0.1, True, True),  # the first attempt streams
        (0, 0.9, False, True),  # may be judged silent: a file holds its text, a pass need not
        (1, 0.1, False, False),  # a retry is sent once accepted (a pass makes none)
    ],
)
def test_what_streams_while_it_decodes(attempt: int, no_speech: float, file: bool,
                                       live: bool) -> None:  # fmt: skip
    assert FILE.streams(attempt, no_speech) is file
    assert pass_plan(LIVE, "en", (), ()).streams(attempt, no_speech) is live
