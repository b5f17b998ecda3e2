"""The runtimes (OpenVINO's own API, ONNX Runtime's CPU provider) behind one seam.

No usage data leaves the service's process, and nothing about it is recorded in the user's home:

- OpenVINO: importing `openvino` imports its model converter (`ovc`), which, unless the user
  opted out in a consent file, counts the import in `~/intel` and sends it to Intel's telemetry
  service. The service never converts models with it, and the converter falls back to its own
  no-op stub when the `openvino_telemetry` package cannot be imported: that import is blocked
  here, before any module of this package imports `openvino`.
- ONNX Runtime (1.32's POSIX telemetry): at its import it writes a device id and queues a
  `ProcessInfo` event under `~/.cache/Microsoft/DeveloperTools/.onnxruntime` for upload;
  `ORT_DISABLE_TELEMETRY=1` set before that import turns it off entirely. A value the user set
  is left as it is.
"""

import os
import sys

sys.modules.setdefault("openvino_telemetry", None)  # None: `import openvino_telemetry` fails
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
