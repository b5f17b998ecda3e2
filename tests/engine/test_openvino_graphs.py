"""Graphs on OpenVINO's own API (`app.runtime.graphs`): bf16 cross K/V, inputs shared, outputs
into the caller's arrays, many threads at once (static-shape devices: `test_npu_emulation`)."""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from app.runtime import contract, graphs
from app.runtime.cpu_kind import kind_of
from app.runtime.graphs import BF16, OpenVINOGraph
from app.runtime.placement import DeviceError, RuntimeOptions, open_graph, openvino_properties
from app.runtime.sessions import WhisperSessions
from tests.conftest import model_dir

PROPERTIES = openvino_properties("CPU", "f32", threads=2)
# Without activation quantization: two compiles of one graph then compute the same numbers to
# ~1e-6. With it (the f32 default on a CPU with VNNI) their ~1e-7 differences can move an input
# across an int8 rounding step, which moved tiny.en's logits by 0.25 on one build of the files.
EXACT = openvino_properties("CPU", "f32", activation_quantization="off", threads=2)


@pytest.fixture(scope="module")
def folder():
    return model_dir("tiny.en")


@pytest.fixture(scope="module")
def cross_names(folder) -> list[str]:
    return contract.encoder_output_names(contract.Manifest.load(folder).dims.n_text_layer)


@pytest.fixture(scope="module")
def encoder(folder) -> OpenVINOGraph:
    return OpenVINOGraph(folder / "encoder.onnx", "CPU", PROPERTIES)


@pytest.fixture(scope="module")
def cross(encoder, cross_names) -> dict[str, np.ndarray]:
    features = np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32)
    return dict(
        zip(cross_names, encoder.run(cross_names, {"input_features": features}), strict=True)
    )


def step_feed(folder, cross: dict[str, np.ndarray], rows: int = 1, past: int = 3) -> dict:
    dims = contract.Manifest.load(folder).dims
    rng = np.random.default_rng(1)
    feed = {
        "input_ids": np.full((rows, 1), 440, np.int64),
        "position_ids": np.full((rows, 1), past, np.int64),
        "attention_mask": np.ones((rows, past + 1), np.int64),
        contract.LOGITS_AT: np.zeros(1, np.int64),
    }
    for name in contract.past_names(dims.n_text_layer):
        shape = (rows, dims.n_heads, past, dims.head_dim)
        feed[name] = rng.standard_normal(shape).astype(np.float32)
    return {**feed, **cross}


def test_bf16_cross_kv_are_taken_and_given_as_bf16(folder, encoder, cross, cross_names) -> None:
    """Declared bf16, the encoder writes its K/V as bf16 and the decoder reads them so: the
    values are the f32 ones to bf16's precision (any CPU; one that computes bf16 skips its
    per-step reorder). OpenVINO computes the projections into a bf16 output in bf16 too:
    up to ~2 of bf16's steps (2^-8) off, not one."""
    encoder_bf16 = OpenVINOGraph(folder / "encoder.onnx", "CPU", PROPERTIES, cross_names)
    features = np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32)
    rounded = encoder_bf16.run(cross_names, {"input_features": features})
    for name, value in zip(cross_names, rounded, strict=True):
        assert value.dtype == BF16
        f32 = cross[name]
        np.testing.assert_allclose(value.astype(np.float32), f32, rtol=2**-6, atol=1e-3)
    slots = [np.empty_like(value) for value in rounded]  # run_into: straight into bf16 slots
    encoder_bf16.run_into({"input_features": features}, dict(zip(cross_names, slots, strict=True)))
    for slot, value in zip(slots, rounded, strict=True):
        np.testing.assert_array_equal(slot.view(np.uint16), value.view(np.uint16))

    decoder = OpenVINOGraph(folder / "decoder.onnx", "CPU", PROPERTIES)
    decoder_bf16 = OpenVINOGraph(folder / "decoder.onnx", "CPU", PROPERTIES, cross_names)
    feed = step_feed(folder, cross)
    (want,) = decoder.run(["logits"], feed)
    (got,) = decoder_bf16.run(["logits"], {**feed, **dict(zip(cross_names, rounded, strict=True))})
    assert got.dtype == np.float32
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    with pytest.raises(ValueError, match="no input or output 'cross_q_0'"):
        OpenVINOGraph(folder / "decoder.onnx", "CPU", PROPERTIES, ["cross_q_0"])


def test_sessions_hand_kv_over_in_the_decoders_precision(folder, monkeypatch) -> None:
    bf16_kind = kind_of(frozenset({"avx512f", "avx512_vnni", "avx512_bf16"}), None)
    monkeypatch.setattr("app.runtime.placement.this_cpu", lambda: bf16_kind)
    bf16 = WhisperSessions.load(folder, RuntimeOptions(device="CPU", inference_precision="auto"))
    f32 = WhisperSessions.load(folder, RuntimeOptions(device="CPU", inference_precision="f32"))
    reference = WhisperSessions.load(folder, RuntimeOptions(ep="cpu"))
    assert (bf16.kv_dtype, f32.kv_dtype, reference.kv_dtype) == (
        BF16,
        np.float32,
        np.float32,
    )
    features = np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32)
    slots = [np.empty((1, 6, 1500, 64), np.float32) for _ in range(8)]
    with pytest.raises(AssertionError, match="cross_k_0"):  # f32 slots for bf16 K/V: refused
        bf16.encode_into(features, slots)
    ids, positions = np.array([[50257, 50362, 440]]), np.arange(3)[None]
    mask = np.ones((1, 3), np.int64)
    logits = {}
    for name, sessions in (("bf16", bf16), ("f32", f32)):
        cross = sessions.encode(features)
        _, past = sessions.decode(ids, positions, mask, sessions.empty_past(), cross)
        assert {a.dtype for a in (*cross, *past)} == {sessions.kv_dtype}
        step = (np.array([[20277]]), np.array([[3]]), np.ones((1, 4), np.int64))
        logits[name], _ = sessions.decode(*step, past, cross)  # the past goes back in as given
    assert logits["bf16"].dtype == np.float32
    worst = np.abs(logits["bf16"] - logits["f32"]).max()
    assert worst < 0.05 * np.abs(logits["f32"]).max()


def test_inputs_are_shared_and_outputs_written_in_place_only_when_asked(folder, encoder, cross):
    decoder = OpenVINOGraph(folder / "decoder.onnx", "CPU", PROPERTIES)
    feed = step_feed(folder, cross)
    (before,) = decoder.run(["logits"], feed)
    feed["past_k_0"] *= 2  # shared, not copied at bind time: the next call sees the change
    (after,) = decoder.run(["logits"], feed)
    assert not np.array_equal(before, after)
    with pytest.raises(ValueError, match="expected"):  # every input, every call
        decoder.run(["logits"], {k: v for k, v in feed.items() if k != "past_k_0"})

    names = list(cross)
    slots = {name: np.zeros_like(value) for name, value in cross.items()}
    features = np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32)
    encoder.run_into({"input_features": features}, slots)
    for name in names:
        np.testing.assert_array_equal(slots[name], cross[name])
    kept = {name: slot.copy() for name, slot in slots.items()}
    encoder.run(names, {"input_features": features * 0.5})  # same thread, same request
    for name in names:  # the slots were let go of: the next call wrote elsewhere
        np.testing.assert_array_equal(slots[name], kept[name])


def test_an_input_given_again_as_the_same_array_stays_bound(
    folder, cross, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same array objects again (a window's cross K/V, a cache's buffers) are not bound
    anew, and their in-place changes are still read; a new array, even with another's values,
    is bound; an array the caller dropped is not kept alive by the request."""
    decoder = OpenVINOGraph(folder / "decoder.onnx", "CPU", PROPERTIES)
    bound: list[str] = []
    real_bind = graphs._bind

    def counted(request, arrays):
        bound.extend(arrays)
        return real_bind(request, arrays)

    monkeypatch.setattr(graphs, "_bind", counted)
    feed = step_feed(folder, cross)
    (first,) = decoder.run(["logits"], feed)
    assert sorted(bound) == sorted(feed)
    bound.clear()
    (again,) = decoder.run(["logits"], feed)
    assert bound == [] and np.array_equal(first, again)
    feed["past_k_0"] *= 2  # changed in place: read at the next call without a new binding
    (changed,) = decoder.run(["logits"], feed)
    assert bound == [] and not np.array_equal(first, changed)
    feed["past_k_0"] = feed["past_k_0"] / 2  # a new array with the first call's values
    (back,) = decoder.run(["logits"], feed)
    assert bound == ["past_k_0"]
    np.testing.assert_allclose(back, first, atol=1e-5)
    dropped = weakref.ref(feed["past_v_0"])
    feed["past_v_0"] = feed["past_v_0"].copy()
    assert dropped() is None  # the request held no reference to it


def test_threads_share_a_graph(folder, cross) -> None:
    decoder = OpenVINOGraph(folder / "decoder.onnx", "CPU", PROPERTIES)
    feeds = [step_feed(folder, cross, rows=rows) for rows in (1, 2, 3, 4)]
    alone = [decoder.run(["logits"], feed)[0] for feed in feeds]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda f: decoder.run(["logits"], f)[0], feeds * 4))
    for i, got in enumerate(together):
        np.testing.assert_array_equal(got, alone[i % 4])


@pytest.mark.parametrize("ep", ["openvino", "cpu"])
def test_a_file_that_is_not_a_model_is_a_device_error(ep: str, tmp_path) -> None:
    """Both runtimes' load failures reach callers as `DeviceError` (the diarization job turns
    it into a 503); ONNX Runtime's own exception types derive from Exception only."""
    broken = tmp_path / "encoder.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(DeviceError, match=f"cannot load encoder.onnx on {ep}/CPU"):
        open_graph(broken, ep, "CPU", 1)
