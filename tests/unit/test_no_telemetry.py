"""The service's process sends OpenVINO no usage data (app/runtime/__init__.py): a fresh
interpreter with an empty home imports the runtime and compiles a graph."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
from app.runtime.graphs import openvino_core  # the service's only way to openvino

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import openvino.tools.ovc.telemetry_utils as converter

x = ops.parameter([1, 4], np.float32, name="x")
openvino_core().compile_model(ov.Model([ops.relu(x)], [x]), "CPU")
print(converter.tm.__name__)
"""


def test_importing_the_runtime_leaves_no_openvino_usage_record_and_sends_nothing(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env | {"HOME": str(home)},
        cwd=Path(__file__).resolve().parents[2],
    )
    # OpenVINO's converter with the telemetry package writes ~/intel/openvino_ga_cid and
    # ~/intel/stats (an import counter) and queues an event for Intel's service
    assert not (home / "intel").exists(), sorted(p.name for p in (home / "intel").iterdir())
    assert out.stdout.strip() == "openvino.tools.ovc.telemetry_stub", out.stdout
