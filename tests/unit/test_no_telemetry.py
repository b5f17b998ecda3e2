"""The service's process sends its runtimes' vendors no usage data and records none in the
user's home (app/runtime/__init__.py): a fresh interpreter with an empty home imports the
runtime, runs a graph on OpenVINO and one on ONNX Runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import sys
from app.runtime.graphs import OrtGraph, openvino_core  # the service's only way to its runtimes

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import openvino.tools.ovc.telemetry_utils as converter

x = ops.parameter([1, 4], np.float32, name="x")
openvino_core().compile_model(ov.Model([ops.relu(x)], [x]), "CPU")
OrtGraph(sys.argv[1], threads=1)  # the VAD's graph, as the service loads it
print(converter.tm.__name__)
"""


def test_the_runtimes_leave_no_usage_records_in_the_home_and_queue_no_events(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ignored = ("CI", "TF_BUILD", "JENKINS_URL", "ORT_DISABLE_TELEMETRY")
    env = {k: v for k, v in os.environ.items() if k not in ignored}
    vad = REPO / "models" / "silero_vad.onnx"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(vad)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env | {"HOME": str(home)},
        cwd=REPO,
    )
    # OpenVINO's converter with its telemetry package writes ~/intel/openvino_ga_cid and
    # ~/intel/stats (an import counter); ONNX Runtime a device id and an event queue under
    # ~/.cache/Microsoft
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    assert written == [], written
    assert out.stdout.strip() == "openvino.tools.ovc.telemetry_stub", out.stdout
