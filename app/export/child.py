"""`obtain_model` in a child process (`python -m app.export build ... --progress-json`), for the
server: a build's peak memory (GBs for the large models) is returned to the system when the child
ends, and a build that crashes or is killed for memory takes only the child down.

The child prints one JSON object per line on stdout: `{"progress": 0..1}` as it goes, then
`{"folder": "<path>"}`; on failure it exits non-zero with `error: <message>` as its last stderr
line. Only the standard library is imported here: the server imports no exporter code.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ChildBuildError(RuntimeError):
    """The child could not obtain the model; the message is the child's own."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The build stops (SIGTERM: cleaned up, nothing half-written) when the server goes away."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def obtain_in_child(
    model_id: str,
    models_dir: Path,
    cache_dir: Path,
    *,
    allow_download: bool,
    on_progress: Callable[[float], None],
) -> Path:
    """The built model folder for `model_id` (see `app.export.obtain.obtain_model`); raises
    `ChildBuildError` with the child's message."""
    command = [
        sys.executable, "-m", "app.export", "build", model_id,
        "--models-dir", str(models_dir), "--cache-dir", str(cache_dir),
        "--skip-existing", "--quiet", "--progress-json",
        *([] if allow_download else ["--no-download"]),
    ]  # fmt: skip
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=_die_with_parent,
    )
    assert child.stdout is not None and child.stderr is not None
    stderr_tail: deque[str] = deque(maxlen=20)
    reader = threading.Thread(target=stderr_tail.extend, args=(child.stderr,), daemon=True)
    reader.start()
    folder: Path | None = None
    for line in child.stdout:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue  # not ours (a library printing to stdout)
        if "progress" in message:
            on_progress(float(message["progress"]))
        elif "folder" in message:
            folder = Path(message["folder"])
    returncode = child.wait()
    reader.join()
    if returncode == 0 and folder is not None:
        return folder
    errors = [line.strip() for line in stderr_tail if line.startswith("error: ")]
    if errors:
        raise ChildBuildError(errors[-1].removeprefix("error: "))
    how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited {returncode}"
    if returncode == -signal.SIGKILL:
        how += " (out of memory? a large model needs several GB to build)"
    tail = " | ".join(line.strip() for line in list(stderr_tail)[-3:])
    raise ChildBuildError(f"the build process {how}{': ' + tail if tail else ''}")
