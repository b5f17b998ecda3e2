"""`make test-cpus`: the numerics- and words-sensitive tests (marker `cpu_kind`) under every CPU
kind this machine can emulate besides its own (which `make test` covers).

The tests marked `per_arithmetic` run once per arithmetic, not per kind: those that read real
speech for its words (minutes each), and those on ONNX Runtime, whose kernels run as the
machine's CPU does under any cap (only the runtime's decisions follow the kind). A kind whose
arithmetic (the precision the CPU computes in, int8 dot products or not: what
`app.runtime.placement` decides by) the machine's own kind or an earlier lane already ran, runs
only the rest: OpenVINO's numerics, whose kernels differ by vector width, checked against the
reference graphs on every kind.

OpenVINO's CPU plugin is held by `ONEDNN_MAX_CPU_ISA` to each smaller instruction set that
changes what it computes (int8 dot products or not, bf16 or not: `app.runtime.cpu_kind`); the
runtime reads the same variable, so it makes the choices a real CPU of that kind gets. ONNX
Runtime's own kernels cannot be held back: they run as the machine's CPU does.

    python -m tests.cpu_lanes [pytest arguments]    # prints one line per kind, exits 1 on a failure
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from app.runtime.cpu_kind import ISA_VARIABLE, CpuKind, this_cpu
from app.runtime.placement import resolved_precision

# the caps that give the kinds users' CPUs are, from the smallest
LANES = (
    "AVX2",
    "AVX2_VNNI",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX512_CORE_AMX",
)


@dataclass(frozen=True)
class Lane:
    """One run of the `cpu_kind` tests held to `cap`; `whole`: with the `per_arithmetic` ones."""

    cap: str
    whole: bool

    @property
    def markers(self) -> str:
        return "cpu_kind" if self.whole else "cpu_kind and not per_arithmetic"


def arithmetic(kind: CpuKind) -> tuple[str | None, bool]:
    """What the service computes in on `kind` by default: the precision, int8 dot products."""
    return resolved_precision("CPU", "auto", kind), kind.int8_dot_products


def lanes(machine: CpuKind) -> list[Lane]:
    """The caps that hold this machine to a kind of its own (by the kind's name: AVX-VNNI beside
    AVX-512 VNNI changes nothing), other than the machine's own kind, smallest first; each with
    the `per_arithmetic` tests if its arithmetic is new."""
    own = CpuKind(machine.groups)
    kinds, arithmetics = {own.name}, {arithmetic(own)}
    chosen = []
    for cap in LANES:
        kind = CpuKind(machine.held(cap).groups)  # the kind, without "held by"
        if kind.name not in kinds:
            kinds.add(kind.name)
            chosen.append(Lane(cap, whole=arithmetic(kind) not in arithmetics))
            arithmetics.add(arithmetic(kind))
    return chosen


def run(lane: Lane, args: list[str]) -> tuple[str, float, int]:
    """pytest -m cpu_kind held to the lane's cap: its summary line, seconds, exit code."""
    env = {**os.environ, ISA_VARIABLE: lane.cap}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", lane.markers, "-p", "no:cacheprovider", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    sys.stdout.write(done.stdout[-6000:] if done.returncode else "")
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?)\s*=*$", done.stdout, re.MULTILINE)
    return (found[-1] if found else "no summary"), time.monotonic() - started, done.returncode


def main(args: list[str]) -> int:
    machine = this_cpu()
    if machine.cap:
        print(f"{ISA_VARIABLE} is already set ({machine.cap}): unset it to run the lanes")
        return 2
    print(f"this machine: {machine.name}; its own kind is `make test`'s")
    failed = False
    for lane in lanes(machine):
        summary, seconds, code = run(lane, args)
        what = "" if lane.whole else ", OpenVINO's numerics only (its arithmetic ran above)"
        name = machine.held(lane.cap).name
        print(f"{name}{what}: {summary} ({seconds / 60:.1f} min)", flush=True)
        failed |= code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
