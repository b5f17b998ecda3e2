"""The benchmarks: scripts run as `python -m benchmarks.<name>` from the repository root
(see README.md); `common` holds what they share, `server` the server they launch."""
