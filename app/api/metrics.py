"""Prometheus metrics on a per-app `CollectorRegistry` (several apps can live in one process).

Requests by route and status, audio seconds, per-stage latency and real-time-factor histograms,
time to the first streamed delta, queue depth, running jobs and active streams. The route is
`app.api.routes.metrics`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.service.batching.records import StepRecord
from app.service.batching.scheduler import BatchingSessions
from app.service.models.loaded import LoadedModel
from app.service.pool import WorkerPool
from app.service.transcription.jobs import TranscriptionResult

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ROW_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5)


class Metrics:
    """All metrics of one app; `render()` gives the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "stt_http_requests",
            "HTTP requests by route and status",
            ["method", "route", "status"],
            registry=r,
        )
        self.transcriptions = Counter(
            "stt_transcriptions",
            "Transcription jobs by model, task and outcome (ok, rejected, error, cancelled)",
            ["model", "task", "outcome"],
            registry=r,
        )
        self.audio_seconds = Counter(
            "stt_audio_seconds", "Seconds of audio transcribed", ["model", "task"], registry=r
        )
        self.stage_seconds = Histogram(
            "stt_stage_seconds",
            "Seconds per stage: queue_wait, decode_audio, vad, mel, encoder, language, decoder, "
            "search, transcribe (all model work), total (request)",
            ["stage", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "stt_real_time_factor",
            "Transcription time / audio duration",
            ["model"],
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.first_delta_seconds = Histogram(
            "stt_time_to_first_delta_seconds",
            "Request start to the first streamed text delta",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.active_streams = Gauge(
            "stt_active_streams", "Open streaming responses (SSE and WebSocket)", registry=r
        )
        self.queue_depth = Gauge("stt_queue_depth", "Jobs waiting for a worker thread", registry=r)
        self.active_jobs = Gauge("stt_active_jobs", "Jobs running on a worker", registry=r)
        self.workers = Gauge("stt_workers", "Transcriptions at the same time", registry=r)
        self.queue_limit = Gauge("stt_queue_limit", "Wait-queue capacity", registry=r)
        self.model_info = Gauge(
            "stt_model_info",
            "Loaded models and their devices (value 1)",
            ["model", "encoder_device", "decoder_device"],
            registry=r,
        )
        self.model_memory = Gauge(
            "stt_model_memory_bytes",
            "Loaded models: growth of the server's RSS while each loaded and warmed up",
            ["model"],
            registry=r,
        )
        self._model_labels: dict[str, tuple[str, str, str]] = {}

        self.batch_rows = Histogram(
            "stt_batch_rows",
            "Rows (sequences) per model call of the batching scheduler, by kind "
            "(decode = one-token step, prefill, encode = windows, align = word timing)",
            ["model", "kind"],
            buckets=ROW_BUCKETS,
            registry=r,
        )
        self.batch_padding = Histogram(
            "stt_batch_padding_ratio",
            "Share of padded past K/V slots per batched decoder step",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.batch_queue_wait = Histogram(
            "stt_batch_queue_wait_seconds",
            "Longest wait of a call between submission and its model call, by kind",
            ["model", "kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_step_seconds = Histogram(
            "stt_batch_step_seconds",
            "Wall time of one scheduler model call (inputs assembled, outputs split), by kind",
            ["model", "kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def model_changed(self, name: str, model: LoadedModel | None) -> None:
        """A model was loaded (`model`) or unloaded (None): its gauges and scheduler metrics."""
        if model is None:
            labels = self._model_labels.pop(name, None)
            if labels is not None:
                self.model_info.remove(*labels)
                self.model_memory.remove(name)
            return
        info = model.info
        labels = (name, info.devices.get("encoder", "?"), info.devices.get("decoder", "?"))
        self._model_labels[name] = labels
        self.model_info.labels(*labels).set(1)
        self.model_memory.labels(name).set(info.memory_bytes or 0)
        if model.scheduler is not None:
            self.bind_batching(name, model.scheduler)

    def bind_batching(self, model: str, scheduler: BatchingSessions) -> None:
        """Observe every model call of a model's batching scheduler."""

        def observe(record: StepRecord) -> None:
            self.batch_rows.labels(model, record.kind).observe(record.rows)
            self.batch_queue_wait.labels(model, record.kind).observe(record.queue_wait_s)
            self.batch_step_seconds.labels(model, record.kind).observe(record.seconds)
            if record.kind == "decode":
                self.batch_padding.labels(model).observe(record.padding_ratio)

        scheduler.add_observer(observe)

    def bind_pool(self, pool: WorkerPool) -> None:
        """Make the queue gauges read the pool when scraped."""
        self.queue_depth.set_function(lambda: pool.queued)
        self.active_jobs.set_function(lambda: pool.active)
        self.workers.set(pool.workers)
        self.queue_limit.set(pool.max_queue)

    def bind_compiles(self, counts: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """`stt_graph_compiles_total{device, source}`: graphs compiled ("compiled") or loaded
        from the compiled-model cache ("cache"), as `counts()` reads them when scraped."""
        self.registry.register(_CompilesCollector(counts))

    def observe_result(
        self, model: str, result: TranscriptionResult, queue_wait_s: float, total_s: float
    ) -> None:
        self.transcriptions.labels(model, result.task, "ok").inc()
        self.audio_seconds.labels(model, result.task).inc(result.duration_s)
        for stage, seconds in result.timings.items():
            self.stage_seconds.labels(stage, model).observe(seconds)
        self.stage_seconds.labels("queue_wait", model).observe(queue_wait_s)
        self.stage_seconds.labels("total", model).observe(total_s)
        if result.duration_s > 0:
            self.rtf.labels(model).observe(result.rtf)

    def observe_failure(self, model: str, task: str, outcome: str) -> None:
        self.transcriptions.labels(model, task, outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CompilesCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "stt_graph_compiles",
            "Graphs compiled for a device (source compiled) or loaded compiled from the cache "
            "(source cache); on a static device (NPU) all at start-up, none during a request",
            labels=["device", "source"],
        )
        for (device, source), n in sorted(self._counts().items()):
            family.add_metric([device, source], n)
        yield family


def batch_rows(exposition: str, model: str, kind: str = "decode") -> tuple[float, float]:
    """(sum, count) of the `stt_batch_rows` histogram of `model`'s `kind` steps in a /metrics
    text (0, 0 when batching is off), for clients that read the scheduler's rows per step."""
    values = {"stt_batch_rows_sum": 0.0, "stt_batch_rows_count": 0.0}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in values and sample.labels == {"kind": kind, "model": model}:
                values[sample.name] = sample.value
    return values["stt_batch_rows_sum"], values["stt_batch_rows_count"]


class RequestMetricsMiddleware:
    """Counts every HTTP response by method, route template and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(scope["method"], path, str(status)).inc()


class Stopwatch:
    """Monotonic seconds since creation."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0
