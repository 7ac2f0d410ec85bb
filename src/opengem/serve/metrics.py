"""The server's Prometheus metrics: requests, errors, latency, batching and the model version served.

Each server owns its own ``CollectorRegistry`` (not prometheus_client's global one), so that several
servers in one process (the tests, the benchmark) never mix their counts. ``/metrics`` renders it in
the Prometheus text format with prometheus_client's own encoder.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# request latency buckets (seconds): sub-millisecond resolution where the targets are (p99 < 5 ms)
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0)
GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0)
STAGES = ("read", "decode", "queue", "score", "reply")  # of one /predict request, in order
CANDIDATE_BUCKETS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class ServerMetrics:
    """Counters, histograms and gauges of one server, and their text exposition."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("opengem_requests", "Scoring requests answered, by body format and HTTP "
                                "status code", ["format", "code"], registry=r)
        self.errors = Counter("opengem_request_errors", "Scoring requests answered with an error, by "
                              "reason kind", ["kind"], registry=r)
        self.latency = Histogram("opengem_request_latency_seconds", "Time from request received to reply "
                                 "ready, successful /predict requests", buckets=LATENCY_BUCKETS, registry=r)
        self.candidates = Histogram("opengem_request_candidates", "Candidates per request",
                                    buckets=CANDIDATE_BUCKETS, registry=r)
        self.batches = Counter("opengem_batches", "score_many calls (forward passes)", registry=r)
        self.batch_requests = Histogram("opengem_batch_requests", "Requests merged into one forward pass",
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.batch_candidates = Histogram("opengem_batch_candidates", "Candidates per forward pass",
                                          buckets=CANDIDATE_BUCKETS, registry=r)
        self.batch_seconds = Histogram("opengem_batch_seconds", "Time of one score_many call",
                                       buckets=LATENCY_BUCKETS, registry=r)
        # the model thread's own CPU time (time.thread_time) in the same call: where a batch's wall time
        # exceeds it, the thread was waiting for a core (other processes), not computing
        self.batch_cpu_seconds = Histogram("opengem_batch_cpu_seconds", "CPU time of the model thread in "
                                           "one score_many call", buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("opengem_requests_in_flight", "Scoring requests received and not yet "
                               "answered", registry=r)
        self.model_info = Gauge("opengem_model_info", "1 for the model version being served",
                                ["version", "trained_through_ts"], registry=r)
        self.stage = Histogram("opengem_request_stage_seconds", "Time of each stage of a successful "
                               "/predict request: read (body), decode (JSON/Arrow), queue (waiting for the "
                               "model, merging included), score (its batch's score_many), reply (encoding)",
                               ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.gc_pause = Histogram("opengem_gc_pause_seconds", "Garbage collections of the server process, by "
                                  "generation (a full collection is generation 2; the one before the heap is "
                                  "frozen at start-up is counted too)", ["generation"],
                                  buckets=GC_BUCKETS, registry=r)
        self.swaps = Counter("opengem_model_swaps", "Hot swaps, by result (swapped or refused)", ["result"],
                             registry=r)

    def set_model(self, version: str, trained_through_ts: int | None) -> None:
        """Show exactly one served version: the old label set goes when a new version comes."""
        self.model_info.clear()
        self.model_info.labels(version=str(version), trained_through_ts=str(trained_through_ts)).set(1)

    def on_batch(self, requests: int, candidates: int, seconds: float, cpu_seconds: float) -> None:
        self.batches.inc()
        self.batch_requests.observe(requests)
        self.batch_candidates.observe(candidates)
        self.batch_seconds.observe(seconds)
        self.batch_cpu_seconds.observe(cpu_seconds)

    def on_gc(self, generation: int, seconds: float) -> None:
        self.gc_pause.labels(generation=str(generation)).observe(seconds)

    def observe_stages(self, **seconds: float) -> None:
        """One request's time per stage (keys from ``STAGES``)."""
        for stage, s in seconds.items():
            self.stage.labels(stage=stage).observe(s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
