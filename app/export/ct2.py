"""Read CTranslate2 Whisper weights (`model.bin`) into numpy, named as Hugging Face names them.

Layout (FACTS.md): `u32 version`; if version >= 2 `str spec`, `u32 revision`; `u32 nvars`, then per
variable `str name, u8 rank, u32 dims[rank], u8 dtype, u32 nbytes, bytes`; then `u32 naliases` and
(alias, target) string pairs. Strings are `u16 length` + bytes ending in NUL.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from app.export.errors import BuildError
from app.export.weights import WhisperWeights

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16 = 5


class _Reader:
    def __init__(self, data: memoryview, source: str) -> None:
        self.data = data
        self.pos = 0
        self.source = source

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise BuildError(
                f"{self.source} is truncated: needed {n} bytes at offset {self.pos}, "
                f"the file has {len(self.data)}"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def string(self) -> str:
        raw = bytes(self.take(self.u16()))
        if not raw.endswith(b"\0"):
            raise BuildError(f"{self.source} is not a CTranslate2 model: bad string at {self.pos}")
        return raw[:-1].decode("utf-8", errors="replace")


def read_model_bin(parts: Iterable[Path]) -> dict[str, np.ndarray]:
    """All variables of a CTranslate2 model file (joined from `parts`), aliases resolved.

    Arrays are views on one buffer holding the file; fp16 stays fp16, bf16 becomes fp32.
    """
    parts = [Path(p) for p in parts]
    source = " + ".join(p.name for p in parts)
    buffer = bytearray()
    for part in parts:
        try:
            buffer += part.read_bytes()
        except OSError as e:
            raise BuildError(f"cannot read weights file {part}: {e.strerror}") from e
    reader = _Reader(memoryview(buffer), source)
    version = reader.u32()
    if version < 1 or version > 100:
        raise BuildError(f"{source} is not a CTranslate2 model.bin (header version {version})")
    if version >= 2:
        spec = reader.string()
        reader.u32()  # spec revision
        if spec != "WhisperSpec":
            raise BuildError(f"{source} holds a {spec!r} model, not a Whisper model")
    variables: dict[str, np.ndarray] = {}
    for _ in range(reader.u32()):
        name = reader.string()
        shape = tuple(reader.u32() for _ in range(reader.u8()))
        dtype_id = reader.u8()
        raw = reader.take(reader.u32())
        if dtype_id == _BF16:
            bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif dtype_id in _DTYPES:
            array = np.frombuffer(raw, dtype=_DTYPES[dtype_id])
        else:
            raise BuildError(f"{source}: variable {name} has unknown dtype id {dtype_id}")
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise BuildError(f"{source}: variable {name} has {array.size} values for shape {shape}")
        variables[name] = array.reshape(shape)
    for _ in range(reader.u32()):
        alias, target = reader.string(), reader.string()
        if target not in variables:
            raise BuildError(f"{source}: alias {alias} points at missing variable {target}")
        variables[alias] = variables[target]
    if reader.pos != len(buffer):
        raise BuildError(f"{source} has {len(buffer) - reader.pos} unexpected trailing bytes")
    return variables


def _dequantize(ct2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Quantized CTranslate2 weights (`int8*` models: int8 `weight` with a float32 `weight_scale`
    per output row; `int16`: one scale) as fp16 `weight / weight_scale` (CTranslate2 stores
    round(w * scale)); other variables as they are, copied out of the file's buffer when some
    were quantized, so the buffer can go."""
    scales = {n for n in ct2 if n.endswith("/weight_scale")}
    if not scales:
        return ct2
    out = {
        name: np.array(array)
        for name, array in ct2.items()
        if name not in scales and f"{name}_scale" not in scales
    }
    done: dict[int, np.ndarray] = {}  # aliases (the tied projection) share their arrays
    for scale_name in scales:
        weight_name = scale_name.removesuffix("_scale")
        quantized = ct2.get(weight_name)
        if quantized is None or quantized.dtype not in (np.int8, np.int16):
            raise BuildError(f"{weight_name} has a scale but is not int8 or int16 weights")
        if id(quantized) not in done:
            scale = np.asarray(ct2[scale_name], np.float32)
            scale = scale.reshape(scale.shape + (1,) * (quantized.ndim - scale.ndim))
            done[id(quantized)] = (quantized.astype(np.float32) / scale).astype(np.float16)
        out[weight_name] = done[id(quantized)]
    return out


def _split(array: np.ndarray, n: int) -> list[np.ndarray]:
    return np.split(array, n, axis=0)


def _attention(out: dict, prefix: str, ct2: dict, src: str, fused: str) -> None:
    """Unfuse CTranslate2's attention linears into HF q/k/v/out projections.

    fused="qkv": linear_0 = [Q;K;V] (self-attention), linear_1 = out.
    fused="kv":  linear_0 = Q, linear_1 = [K;V] (cross-attention), linear_2 = out.
    """
    if fused == "qkv":
        q_w, k_w, v_w = _split(ct2[f"{src}/linear_0/weight"], 3)
        q_b, _k_b, v_b = _split(ct2[f"{src}/linear_0/bias"], 3)
        o = "linear_1"
    else:
        q_w, q_b = ct2[f"{src}/linear_0/weight"], ct2[f"{src}/linear_0/bias"]
        k_w, v_w = _split(ct2[f"{src}/linear_1/weight"], 2)
        _k_b, v_b = _split(ct2[f"{src}/linear_1/bias"], 2)
        o = "linear_2"
    out[f"{prefix}.q_proj.weight"], out[f"{prefix}.q_proj.bias"] = q_w, q_b
    out[f"{prefix}.k_proj.weight"] = k_w  # Whisper's key projection has no bias (stored as zeros)
    out[f"{prefix}.v_proj.weight"], out[f"{prefix}.v_proj.bias"] = v_w, v_b
    out[f"{prefix}.out_proj.weight"] = ct2[f"{src}/{o}/weight"]
    out[f"{prefix}.out_proj.bias"] = ct2[f"{src}/{o}/bias"]


def _norm(out: dict, dst: str, ct2: dict, src: str) -> None:
    out[f"{dst}.weight"], out[f"{dst}.bias"] = ct2[f"{src}/gamma"], ct2[f"{src}/beta"]


def _linear(out: dict, dst: str, ct2: dict, src: str) -> None:
    out[f"{dst}.weight"], out[f"{dst}.bias"] = ct2[f"{src}/weight"], ct2[f"{src}/bias"]


def _layer_count(ct2: dict, stack: str) -> int:
    pattern = re.compile(rf"^{stack}/layer_(\d+)/")
    return 1 + max((int(m.group(1)) for k in ct2 if (m := pattern.match(k))), default=-1)


def ct2_to_hf(ct2: dict[str, np.ndarray]) -> WhisperWeights:
    """Rename/unfuse CTranslate2 Whisper variables (dequantized to fp16 when quantized) to
    `WhisperForConditionalGeneration` names.

    The output projection stays tied to `model.decoder.embed_tokens.weight` (no `proj_out`).
    """
    ct2 = _dequantize(ct2)
    try:
        hf: dict[str, np.ndarray] = {
            "model.encoder.embed_positions.weight": ct2["encoder/position_encodings/encodings"],
            "model.decoder.embed_positions.weight": ct2["decoder/position_encodings/encodings"],
            "model.decoder.embed_tokens.weight": ct2["decoder/embeddings/weight"],
        }
        for conv in ("conv1", "conv2"):
            _linear(hf, f"model.encoder.{conv}", ct2, f"encoder/{conv}")
        _norm(hf, "model.encoder.layer_norm", ct2, "encoder/layer_norm")
        _norm(hf, "model.decoder.layer_norm", ct2, "decoder/layer_norm")
        for stack in ("encoder", "decoder"):
            for i in range(_layer_count(ct2, stack)):
                src, dst = f"{stack}/layer_{i}", f"model.{stack}.layers.{i}"
                _attention(hf, f"{dst}.self_attn", ct2, f"{src}/self_attention", "qkv")
                _norm(hf, f"{dst}.self_attn_layer_norm", ct2, f"{src}/self_attention/layer_norm")
                if stack == "decoder":
                    _attention(hf, f"{dst}.encoder_attn", ct2, f"{src}/attention", "kv")
                    _norm(hf, f"{dst}.encoder_attn_layer_norm", ct2, f"{src}/attention/layer_norm")
                _linear(hf, f"{dst}.fc1", ct2, f"{src}/ffn/linear_0")
                _linear(hf, f"{dst}.fc2", ct2, f"{src}/ffn/linear_1")
                _norm(hf, f"{dst}.final_layer_norm", ct2, f"{src}/ffn/layer_norm")
    except KeyError as e:
        raise BuildError(
            f"the weights lack variable {e.args[0]}: not a complete Whisper model"
        ) from e
    heads = {int(ct2.get(f"{stack}/num_heads", -1)) for stack in ("encoder", "decoder")}
    if len(heads) != 1 or -1 in heads:
        raise BuildError(f"encoder and decoder head counts are missing or differ: {heads}")
    return WhisperWeights(tensors=hf, n_heads=heads.pop())
