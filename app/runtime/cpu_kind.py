"""Which arithmetic this CPU offers the runtimes: int8 dot products, native bf16.

The answer is not /proc/cpuinfo alone: `ONEDNN_MAX_CPU_ISA` holds OpenVINO's CPU plugin (its
oneDNN kernels and its own JIT kernels) to a smaller instruction set, and a CPU so held computes
as the smaller one does. Without int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, AMX) an
int8 matrix multiply multiplies u8 x s8 and adds pairs into int16 (`vpmaddubsw`), which saturates
above 32767: an int8-input layer is then off its integer result by up to ~10 % of its range
(AVX2-only AMD EPYC, and any CPU held to `AVX2` or `AVX512_CORE`: FACTS.md). So the runtimes run
such layers in float where the kind lacks them (`graphs.FLOAT_INT8_INPUTS`).

`kind_of(flags, cap)` is the decision as a pure function; `this_cpu()` reads the machine.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

# oneDNN's ISA names (`ONEDNN_MAX_CPU_ISA`) and the instruction groups each admits; a cap admits
# only what its own hierarchy holds (AVX512_CORE does not hold AVX-VNNI: held there, a CPU that
# has AVX-VNNI computes without it, as measured).
_AVX2 = frozenset({"avx2"})
_AVX512 = _AVX2 | {"avx512"}
_AVX512_VNNI = _AVX512 | {"avx512_vnni"}
_AVX512_BF16 = _AVX512_VNNI | {"avx512_bf16"}
_AMX = _AVX512_BF16 | {"amx"}
CAPS: dict[str, frozenset[str]] = {
    "SSE41": frozenset(),
    "AVX": frozenset(),
    "AVX2": _AVX2,
    "AVX2_VNNI": _AVX2 | {"avx_vnni"},
    "AVX2_VNNI_2": _AVX2 | {"avx_vnni"},
    "AVX512_CORE": _AVX512,
    "AVX512_CORE_VNNI": _AVX512_VNNI,
    "AVX512_CORE_BF16": _AVX512_BF16,
    "AVX512_CORE_FP16": _AVX512_BF16,
    "AVX10_1_512": _AVX512_BF16,
    "AVX512_CORE_AMX": _AMX,
    "AVX10_1_512_AMX": _AMX,
    "AVX512_CORE_AMX_FP16": _AMX,
    "AVX10_1_512_AMX_FP16": _AMX,
    "AVX10_2_512": _AVX512_BF16,
    "AVX10_2_512_AMX_2": _AMX,
}
# /proc/cpuinfo flag -> the instruction group it provides
_FLAGS = {
    "avx2": "avx2",
    "avx512f": "avx512",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "avx512_bf16": "avx512_bf16",
    "amx_int8": "amx",
    "amx_bf16": "amx",
}
# a kind's name: that of the first group it has, in this order
_NAMES = (
    ("amx", "AVX-512 BF16 + AMX"),
    ("avx512_bf16", "AVX-512 BF16"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx512", "AVX-512 without VNNI"),
    ("avx_vnni", "AVX2 + AVX-VNNI"),
    ("avx2", "AVX2"),
)
_INT8_DOT_PRODUCTS = ("avx512_vnni", "avx_vnni", "amx")
_NATIVE_BF16 = ("avx512_bf16", "amx")
ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"


@dataclass(frozen=True)
class CpuKind:
    """What the CPU computes with: `groups` are its instruction groups (as `CAPS` names them)
    that the cap admits; `cap` is the `ONEDNN_MAX_CPU_ISA` in force (None: none)."""

    groups: frozenset[str]
    cap: str | None = None

    @property
    def int8_dot_products(self) -> bool:
        """int8 x int8 products accumulate in int32 (VNNI/AMX); without them they saturate."""
        return any(g in self.groups for g in _INT8_DOT_PRODUCTS)

    @property
    def native_bf16(self) -> bool:
        return any(g in self.groups for g in _NATIVE_BF16)

    @property
    def name(self) -> str:
        """E.g. "AVX-512 BF16 + AMX", "AVX2 (held by ONEDNN_MAX_CPU_ISA=AVX2)"."""
        name = next((name for group, name in _NAMES if group in self.groups), "no AVX2")
        return f"{name} (held by {ISA_VARIABLE}={self.cap})" if self.cap else name

    def held(self, cap: str | None) -> CpuKind:
        """This kind held to the oneDNN ISA `cap` (None or a name oneDNN does not know, which it
        ignores: this kind)."""
        cap = cap.strip().upper() if cap else None
        return CpuKind(self.groups & CAPS[cap], cap) if cap in CAPS else self


def kind_of(flags: frozenset[str], cap: str | None) -> CpuKind:
    """The kind of a CPU with /proc/cpuinfo `flags` held to the oneDNN ISA `cap` (`held`)."""
    return CpuKind(frozenset(_FLAGS[f] for f in flags if f in _FLAGS)).held(cap)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo's text."""
    found = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    return frozenset(found.group(1).split()) if found else frozenset()


@functools.cache
def this_cpu() -> CpuKind:
    """This machine's CPU kind, held to `ONEDNN_MAX_CPU_ISA` if set (read once per process,
    as OpenVINO reads it)."""
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        flags = frozenset()
    return kind_of(flags, os.environ.get(ISA_VARIABLE) or os.environ.get("DNNL_MAX_CPU_ISA"))
