"""The runtimes (OpenVINO's own API, ONNX Runtime's CPU provider) behind one seam.

No usage data from OpenVINO: importing `openvino` imports its model converter (`ovc`), which,
unless the user opted out in a consent file, counts the import in `~/intel` and sends it to
Intel's telemetry service. The service never converts models with it, and the converter falls
back to its own no-op stub when the `openvino_telemetry` package cannot be imported, so that
import is blocked here, before any module of this package imports `openvino`.
"""

import sys

sys.modules.setdefault("openvino_telemetry", None)  # None: `import openvino_telemetry` fails
