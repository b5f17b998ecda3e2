"""The server's glibc malloc settings: a decoder step's arrays come from the heap and are reused,
and the heap's free pages go back to the system on `release_free_memory`. Each case runs in a
fresh interpreter (malloc settings are per process); no model needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtime.memory import malloc_environment

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

PROBE = """
import json, resource
import numpy as np
from app.runtime.memory import release_free_memory, tune_malloc

def rss_mb():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS")).split()[1]) / 1024

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def step_faults(size, steps):
    # faults while an array of `size` floats is made and dropped `steps` times (warmed up)
    for _ in range(3):
        np.ones(size, np.float32)
    before = faults()
    for _ in range(steps):
        np.ones(size, np.float32)
    return faults() - before

assert tune_malloc()
# a decoder step's worth: 1 MB arrays made and dropped again and again
narrow = step_faults(250_000, 200)
# the 25 rows of a window's fallback attempts decoded together: 5.2 MB of logits a step
wide = step_faults(1_300_000, 50)
# 150 MB of such arrays freed between small arrays still in use: the heap keeps their pages
held, pins = [], []
for _ in range(150):
    held.append(np.ones(250_000, np.float32))
    pins.append(np.ones(20_000, np.float32))
start = rss_mb()
del held
freed = rss_mb()
release_free_memory()
released = rss_mb()
print(json.dumps(dict(
    step_faults=narrow, wide_step_faults=wide,
    start=start, freed=freed, released=released,
)))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    """The probe's figures, from one fresh interpreter for the module's tests."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)


def test_a_steps_arrays_are_reused_not_faulted_in_again(probe: dict) -> None:
    """200 arrays of 1 MB one after the other: reused heap memory, not 200 fresh mappings
    (with a 256 KiB mmap threshold this was ~256 faults per array: 51 000)."""
    assert probe["step_faults"] < 2_000


def test_a_wide_steps_arrays_are_reused_too(probe: dict) -> None:
    """50 arrays of 5.2 MB (the logits of 25 rows): reused, not mapped afresh (with a 4 MiB
    mmap threshold: ~1270 faults per array, 63 000)."""
    assert probe["wide_step_faults"] < 2_000


def test_freed_heap_pages_go_back_to_the_system_on_release(probe: dict) -> None:
    m = probe
    assert m["freed"] > m["start"] - 30, "the freed arrays left the heap before the release"
    assert m["released"] < m["freed"] - 100, m


def test_make_run_and_the_image_start_the_server_with_the_same_settings() -> None:
    """Values set in the environment win over `tune_malloc`'s: `make run` and the Dockerfile
    must carry the settings of app/runtime/memory.py, not older ones."""
    root = Path(__file__).resolve().parents[2]
    makefile = next(
        line
        for line in (root / "Makefile").read_text().splitlines()
        if line.startswith("MALLOC_ENV")
    )
    dockerfile = (root / "Dockerfile").read_text()
    for name, value in malloc_environment().items():
        assert f"{name}={value}" in makefile.split(), (name, makefile)
        assert f"{name}={value} " in dockerfile or f"{name}={value}\n" in dockerfile, name
