"""A serving process's numpy BLAS runs on one thread, so nothing spins on the cores the encoder
needs after a log-mel (app/runtime/blas.py). Each case is a fresh interpreter that builds the
server's app (BLAS settings are per process); no model needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, resource, time
import numpy as np
import threadpoolctl
from app.main import create_app
from app.engine.mel import log_mel_spectrogram

create_app()
audio = np.random.default_rng(0).standard_normal(30 * 16000).astype(np.float32)
idle_cpu = []
for _ in range(3):
    log_mel_spectrogram(audio)  # a window's filterbank product, as before every encoder call
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(0.3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    idle_cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
threads = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
print(json.dumps({"idle_cpu_s": idle_cpu, "blas_threads": threads}))
"""


def probe(tmp_path: Path, **env: str) -> dict:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
    environment |= {"STT_MODELS_DIR": str(tmp_path), "STT_DATA_DIR": str(tmp_path / "data")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=environment | env,
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_after_a_log_mel_no_blas_thread_spins_in_the_server_process(tmp_path: Path) -> None:
    """OpenBLAS's own threads busy-wait ~0.1 s of CPU after each product (measured: 0.104 s of a
    0.3 s sleep on a 2-core EPYC); held to one thread, the process is idle while it sleeps."""
    found = probe(tmp_path)
    assert found["blas_threads"] and set(found["blas_threads"]) == {1}, found
    assert max(found["idle_cpu_s"]) < 0.02, found


def test_a_blas_thread_count_set_in_the_environment_is_left_alone(tmp_path: Path) -> None:
    found = probe(tmp_path, OPENBLAS_NUM_THREADS="2")
    assert set(found["blas_threads"]) == {2}, found
