"""`python -m app transcribe` end to end: transcript on stdout, timings on stderr."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

from tests.conftest import AUDIO, MODELS_DIR, REPO, model_dir
from tests.conversation import two_speakers
from tests.engine.conftest import JFK, REFERENCES, normalise


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", "transcribe", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_srt_with_timings():
    model_dir("tiny.en")
    done = run_cli(
        str(AUDIO / JFK),
        "--model", "tiny.en",
        "--models-dir", str(MODELS_DIR),
        "--ep", "cpu",
        "--beam-size", "1",
        "--kv-cache", "static",
        "--format", "srt",
        "--verbose",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "1" and " --> " in lines[1]
    text = " ".join(line for line in lines if line and not line[0].isdigit())
    assert normalise(text) == normalise(REFERENCES[JFK])
    for stage in ("mel", "encoder", "decoder", "tokens/s", "RTF", "K/V cache"):
        assert stage in done.stderr


def test_cli_json_prints_words():
    model_dir("tiny.en")
    done = run_cli(
        str(AUDIO / JFK),
        "--model", "tiny.en",
        "--models-dir", str(MODELS_DIR),
        "--beam-size", "1",
        "--word-timestamps",
        "--format", "json",
        "--verbose",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    words = result["words"]
    assert normalise(" ".join(w["word"] for w in words)) == normalise(REFERENCES[JFK])
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in itertools.pairwise(words))
    assert "word timing" in done.stderr


def test_cli_reports_a_bad_file(tmp_path):
    model_dir("tiny.en")
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio")
    done = run_cli(str(bad), "--model", "tiny.en", "--models-dir", str(MODELS_DIR), "--ep", "cpu")
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and "Traceback" not in done.stderr


def _conversation(folder) -> str:
    """The two-speaker conversation of `tests/conversation.py` as a wav file."""
    path = folder / "talk.wav"
    path.write_bytes(two_speakers().wav)
    return str(path)


def test_cli_diarize_prints_who_said_what(tmp_path):
    model_dir("tiny.en")
    common = ("--model", "tiny.en", "--models-dir", str(MODELS_DIR), "--ep", "cpu")
    common += ("--beam-size", "1")
    talk = _conversation(tmp_path)
    done = run_cli(talk, *common, "--diarize", "--num-speakers", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    speakers = [line.split(": ", 1)[0] for line in lines]
    assert [who for who, _ in itertools.groupby(speakers)] == ["A", "B", "A"], lines
    b_text = normalise(" ".join(line[3:] for line in lines if line.startswith("B: ")))
    assert b_text.startswith("if the reader will excuse me") and "stuff" not in b_text
    done = run_cli(talk, *common, "--diarize", "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"task", "duration", "text", "segments", "usage"}
    assert [s["speaker"] for s in result["segments"]] == speakers
    assert all(s["type"] == "transcript.text.segment" for s in result["segments"])
