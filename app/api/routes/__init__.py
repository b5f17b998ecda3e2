"""HTTP routers: audio (transcriptions, translations), models, health (metrics: app.api.metrics)."""
