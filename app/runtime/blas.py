"""numpy's BLAS held to one thread in a serving process: the inference runtimes own the cores.

numpy's wheels bring OpenBLAS, which starts a thread per core and, after each matrix product,
keeps those threads busy-waiting for more work for a while before they sleep. The service's own
products are small (the log-mel filterbank: [3000, 201] by [201, 80] per 30 s window), and each
log-mel is followed at once by an encoder call: the spinning threads took the cores OpenVINO's
encoder was given (on a 2-core EPYC, tiny.en, the 60 s clip through the server: encoder 256-275
ms a request with them, 197-221 ms held to one thread; `benchmarks/results/blas_threads.md`).

`OPENBLAS_NUM_THREADS` / `OMP_NUM_THREADS` set before the process starts are left alone.
"""

from __future__ import annotations

import os

from threadpoolctl import threadpool_limits

USER_SETTINGS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def quiet_blas() -> bool:
    """Hold numpy's BLAS to one thread; False (nothing changed) when the environment sets it."""
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    threadpool_limits(limits=1, user_api="blas")
    return True
