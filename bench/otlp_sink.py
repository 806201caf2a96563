"""A local OTLP/HTTP trace receiver for benchmarks: takes every export, keeps only counts.

It answers POST /v1/traces (protobuf, as the gateway's exporter sends it) with an empty
ExportTraceServiceResponse and counts the exports, bytes and spans it was sent; GET /stats
returns them as JSON, GET /health answers 200. Needs opentelemetry-proto (the `otel` extra).

Run: .venv/bin/python bench/otlp_sink.py --port 4318
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ANSWER = ExportTraceServiceResponse().SerializeToString()


class Sink(ThreadingHTTPServer):
    """The receiver and its counts."""

    daemon_threads = True

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.lock = threading.Lock()
        self.counts = {"exports": 0, "bytes": 0, "spans": 0}

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self.lock:
            self.counts["exports"] += 1
            self.counts["bytes"] += len(body)
            self.counts["spans"] += spans


class Handler(BaseHTTPRequestHandler):
    server: Sink
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector serves its exporters

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path != "/v1/traces":
            self._answer(404, b"", "text/plain")
            return
        self.server.add(body)
        self._answer(200, ANSWER, "application/x-protobuf")

    def do_GET(self) -> None:
        if self.path == "/stats":
            with self.server.lock:
                self._answer(200, json.dumps(self.server.counts).encode(), "application/json")
        elif self.path == "/health":
            self._answer(200, b"", "text/plain")
        else:
            self._answer(404, b"", "text/plain")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    with Sink(args.port) as sink:
        sink.serve_forever()


if __name__ == "__main__":
    main()
