"""A model folder whose weights are in external data files (`<graph>.onnx.data`): the same
outputs as the embedded files, and the mapped originals dropped once each graph has run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from app.engine.mel import log_mel_spectrogram, pad_or_trim
from app.runtime.contract import N_SAMPLES_PER_WINDOW
from app.runtime.mapped_weights import read_only_mappings, resident_bytes
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from tests.conftest import model_dir
from tests.engine.conftest import JFK, clip

STAGES = ("encoder", "decoder")


@pytest.fixture(scope="module")
def external_tiny(tmp_path_factory) -> tuple[WhisperSessions, Path]:
    source, folder = model_dir("tiny.en"), tmp_path_factory.mktemp("tiny.en-external")
    for name in ("manifest.json", "tokenizer.json"):
        (folder / name).write_bytes((source / name).read_bytes())
    for stage in STAGES:
        onnx.save(
            onnx.load(source / f"{stage}.onnx"),
            folder / f"{stage}.onnx",
            save_as_external_data=True,
            location=f"{stage}.onnx.data",
            size_threshold=1024,
        )
    return WhisperSessions.load(folder, RuntimeOptions(device="CPU")), folder


def test_external_weights_run_alike_and_are_dropped_once_packed(tiny, external_tiny) -> None:
    sessions, folder = external_tiny
    data = {stage: folder / f"{stage}.onnx.data" for stage in STAGES}
    for stage in STAGES:  # OpenVINO maps the file rather than copying it
        assert read_only_mappings([data[stage]]), f"{stage}.onnx.data is not mapped"
    mel = log_mel_spectrogram(clip(JFK), 80, padding=N_SAMPLES_PER_WINDOW)
    features = pad_or_trim(mel)[None]
    ids = np.array([[50257, 50362, 440, 20277]], np.int64)  # any ids of the vocabulary
    positions, mask = np.arange(4, dtype=np.int64)[None], np.ones((1, 4), np.int64)
    for _ in range(2):  # the first call packs the weights and releases the file's pages
        expected, got = tiny.encode(features), sessions.encode(features)
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_array_equal(g, e)
        logits, past = sessions.decode(ids, positions, mask, sessions.empty_past(), got)
        ref_logits, ref_past = tiny.decode(ids, positions, mask, tiny.empty_past(), expected)
        np.testing.assert_array_equal(logits, ref_logits)
        for e, g in zip(ref_past, past, strict=True):
            np.testing.assert_array_equal(g, e)
        targets = np.array([[440, 20277, 11, 1]], np.int64)
        ref_aligned = tiny.align(ids, targets, expected)
        for e, g in zip(ref_aligned, sessions.align(ids, targets, got), strict=True):
            np.testing.assert_array_equal(g, e)
        # a one-token step on the past: another shape
        step, at, step_mask = np.array([[1770]], np.int64), positions[:, -1:] + 1, np.ones((1, 5))
        step_mask = step_mask.astype(np.int64)
        got_step, _ = sessions.decode(step, at, step_mask, past, got)
        ref_step, _ = tiny.decode(step, at, step_mask, ref_past, expected)
        np.testing.assert_array_equal(got_step, ref_step)
        for stage in STAGES:
            # packing read every page; what a call reads directly (norms, biases, embedding rows)
            # comes back (tiny.en's decoder: ~16 %), the packed matrices' originals do not
            resident = resident_bytes([data[stage]])
            assert resident < data[stage].stat().st_size // 4, f"{stage}: {resident} B resident"
