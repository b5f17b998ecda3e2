"""The server builds models in a child process (app/export/child.py): the folder and the progress
come back over its stdout, its errors as the child's own message, and a killed child is said so."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from app.export.child import ChildBuildError, obtain_in_child
from tests.conftest import WEIGHTS_CACHE


def _children_running(module: str) -> list[int]:
    """This process's children whose command line names `module` (read from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and module in cmdline:
            found.append(int(proc.name))
    return found


def test_a_catalog_model_is_built_in_a_child_with_rising_progress(tmp_path: Path) -> None:
    progress: list[float] = []
    folder = obtain_in_child(
        "tiny.en", tmp_path, WEIGHTS_CACHE, allow_download=False, on_progress=progress.append
    )
    assert folder == (tmp_path / "tiny.en").resolve()
    assert (folder / "manifest.json").is_file() and (folder / "encoder.onnx").is_file()
    assert progress == sorted(progress) and progress[-1] == 1.0, progress
    assert any(0.8 < p < 1.0 for p in progress), progress  # the build's own steps show
    # built already: the same folder at once, nothing rebuilt
    mtime = (folder / "manifest.json").stat().st_mtime_ns
    assert obtain_in_child("tiny.en", tmp_path, WEIGHTS_CACHE, allow_download=False,
                           on_progress=progress.append) == folder  # fmt: skip
    assert (folder / "manifest.json").stat().st_mtime_ns == mtime


def test_the_childs_error_message_is_the_error(tmp_path: Path) -> None:
    with pytest.raises(ChildBuildError, match=r"tiny\.en is not built and its packages are not in"):
        obtain_in_child(
            "tiny.en", tmp_path / "models", tmp_path / "empty-cache",
            allow_download=False, on_progress=lambda _f: None,
        )  # fmt: skip
    assert not (tmp_path / "models" / "tiny.en").exists()


def test_a_killed_build_is_reported_and_leaves_no_folder(tmp_path: Path) -> None:
    """The child is killed mid-build (as the kernel's OOM killer would): the error says so."""
    seen = threading.Event()

    def kill_on_first_progress(_fraction: float) -> None:
        if not seen.is_set():
            seen.set()
            for pid in _children_running("app.export"):
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(ChildBuildError, match=r"killed by signal 9 \(out of memory\?"):
        obtain_in_child("tiny.en", tmp_path, WEIGHTS_CACHE, allow_download=False,
                        on_progress=kill_on_first_progress)  # fmt: skip
    assert not (tmp_path / "tiny.en").exists()


def test_the_next_build_removes_what_a_killed_one_left(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])  # a process id that is no longer running
    dead.wait()
    orphan = tmp_path / f".tiny.en.partial-{dead.pid}"
    (orphan / "encoder.onnx").parent.mkdir()
    (orphan / "encoder.onnx").write_bytes(b"half")
    folder = obtain_in_child("tiny.en", tmp_path, WEIGHTS_CACHE, allow_download=False,
                             on_progress=lambda _f: None)  # fmt: skip
    assert (folder / "manifest.json").is_file() and not orphan.exists()
