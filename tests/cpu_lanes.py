"""`make test-cpus`: the numerics- and words-sensitive tests (marker `cpu_kind`) under every CPU
kind this machine can emulate besides its own (which `make test` covers).

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

from app.runtime.cpu_kind import ISA_VARIABLE, CpuKind, this_cpu

# the caps that give the kinds users' CPUs are, from the smallest
LANES = (
    "AVX2",
    "AVX2_VNNI",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX512_CORE_AMX",
)


def lanes(machine: CpuKind) -> list[str]:
    """The caps that hold this machine to a kind of its own (by the kind's name: AVX-VNNI beside
    AVX-512 VNNI changes nothing), other than the machine's own kind, smallest first."""
    seen = {CpuKind(machine.groups).name}
    chosen = []
    for cap in LANES:
        name = CpuKind(machine.held(cap).groups).name  # the kind, without "held by"
        if name not in seen:
            seen.add(name)
            chosen.append(cap)
    return chosen


def run(cap: str, args: list[str]) -> tuple[str, float, int]:
    """pytest -m cpu_kind held to `cap`: its summary line, seconds, exit code."""
    env = {**os.environ, ISA_VARIABLE: cap}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cpu_kind", "-p", "no:cacheprovider", *args],
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
    for cap in lanes(machine):
        summary, seconds, code = run(cap, args)
        print(f"{machine.held(cap).name}: {summary} ({seconds / 60:.1f} min)", flush=True)
        failed |= code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
