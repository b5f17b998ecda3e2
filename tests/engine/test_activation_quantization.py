"""Activation quantization (int8 inputs to the int8 linear layers, OpenVINO CPU), asked for with
`STT_ACTIVATION_QUANTIZATION=on`: what it gives and what the default must not lose.

Off by default on every CPU kind (`auto`): with today's files it changes words on the kinds that
compute f32 with int8 dot products (`app.runtime.placement._activation_groups`). Asked for, it
must not make a transcript depend on the load: a row's logits alone and packed with others' are
the same (the batching scheduler packs rows by load). OpenVINO applies it only where the CPU has
int8 dot products and computes f32.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from app.runtime.cpu_kind import this_cpu
from app.runtime.placement import RuntimeOptions, openvino_properties
from app.runtime.sessions import WhisperSessions
from tests.conftest import model_dir
from tests.engine import devcorpus

# `make test-cpus` runs the cpu_kind tests under each CPU kind, the words tests under each
# arithmetic (tests/cpu_lanes.py); base's pass over the devcorpus runs on the machine's own kind
# only (`make test`): the lanes' time budget
PER_KIND = pytest.mark.cpu_kind
PER_ARITHMETIC = [pytest.mark.cpu_kind, pytest.mark.per_arithmetic]

ROWS = 8
PAST = 20

needs_int8_dot_products = pytest.mark.skipif(
    not this_cpu().int8_dot_products,
    reason=f"OpenVINO quantizes activations only with int8 dot products ({this_cpu().name})",
)


@cache
def quantized(name: str) -> WhisperSessions:
    """The int8 files computing f32 with their activations quantized (asked for)."""
    options = RuntimeOptions(device="CPU", inference_precision="f32", activation_quantization="on")
    return WhisperSessions.load(model_dir(name), options)


def step_inputs(sessions: WhisperSessions, rows: int) -> tuple:
    """One decoder step of `rows` rows, each on its own window and past (seeded)."""
    d = sessions.manifest.dims
    rng = np.random.default_rng(0)
    features = rng.standard_normal((ROWS, d.n_mels, 3000)).astype(np.float32)
    cross = [c[:rows] for c in sessions.encode(features)]
    past = [
        rng.standard_normal((ROWS, d.n_heads, PAST, d.head_dim), dtype=np.float32)[:rows]
        for _ in range(2 * d.n_text_layer)
    ]
    ids = np.full((rows, 1), 440, np.int64)
    positions = np.full((rows, 1), PAST, np.int64)
    return ids, positions, np.ones((rows, PAST + 1), np.int64), past, cross


@PER_KIND
@needs_int8_dot_products
@pytest.mark.parametrize("model", ["tiny.en", "base"])
def test_asked_for_a_rows_logits_do_not_depend_on_the_rows_beside_it(model) -> None:
    sessions = quantized(model)
    alone = sessions.decode(*step_inputs(sessions, 1))[0][0]
    packed = sessions.decode(*step_inputs(sessions, ROWS))[0][0]
    np.testing.assert_array_equal(alone, packed)


@PER_KIND
def test_the_default_quantizes_no_activation_on_any_cpu_kind() -> None:
    for precision in ("auto", "f32", "bf16", None):
        properties = openvino_properties("CPU", precision)
        assert properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0", precision


@pytest.mark.parametrize("model", [pytest.param("tiny.en", marks=PER_ARITHMETIC), "base"])
def test_the_default_on_this_cpu_kind_loses_no_words_against_the_exact_computation(
    model, request
) -> None:
    """The service's default on this CPU kind (the int8 files, precision auto, no activation
    quantized) against the exact computation (fp16 files, f32, nothing quantized; its texts
    written once, `devcorpus.exact_texts`), greedy on the devcorpus: no more errors than the
    paired noise. (Word for word on the repo's 9 clips it held on the AMX Xeon; the AVX-512
    BF16 EPYC's int8 kernels read a near-tie word or two otherwise, as computing the int8 files
    exactly in float there does too.)"""
    default = request.getfixturevalue({"tiny.en": "tiny_tr", "base": "base_tr"}[model])
    result = devcorpus.paired(devcorpus.exact_texts(model), devcorpus.transcripts(default, 1))
    print(f"{model} default against the exact computation ({this_cpu().name}): {result}")
    assert result.extra <= result.noise, (str(result), this_cpu().name)
