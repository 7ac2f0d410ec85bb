"""A fake Predictor and HTTP helpers for the server tests.

The fake keeps the Predictor's contract (score_many = one call over all requests; BadRequest with one line
for an unknown feature or a value of the wrong type) and records every call, so that the tests can count
forward passes and see which version answered, without torch in the loop.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opengem.data.commit import atomic_write_text
from opengem.serve.errors import BadRequest

if TYPE_CHECKING:
    from opengem.data.schema import FeatureSchema

FEATURES = {"user_id": int, "ad_id": int, "bid": float}
SURFACES = ["feed", "stories"]


class FakePredictor:
    """Scores sigmoid(bias + 0.01 * ad_id + 0.1 * bid); ``delay_s`` per call simulates a slow model."""

    def __init__(self, version: str = "v0", bias: float = 0.0, delay_s: float = 0.0, nan: bool = False,
                 tasks: tuple[str, ...] = ("click", "conversion")) -> None:
        self.version = version
        self.trained_through_ts = 1000
        self.tasks = list(tasks)
        self.surfaces = list(SURFACES)
        self.bias, self.delay_s, self.nan = bias, delay_s, nan
        self.calls: list[int] = []  # requests per score_many call
        self._lock = threading.Lock()

    def _check(self, req: dict[str, Any]) -> None:
        surface = req.get("surface", 0)
        if surface not in SURFACES and surface not in range(len(SURFACES)):
            raise BadRequest(f"unknown surface {surface!r}; one of {SURFACES}")
        for where, feats in [("context", req.get("context", {}))] + [
                (f"candidates[{i}]", c) for i, c in enumerate(req["candidates"])]:
            for k, v in feats.items():
                if k not in FEATURES:
                    raise BadRequest(f"{where}: unknown feature {k!r}")
                ok = isinstance(v, (int, float)) if FEATURES[k] is float else isinstance(v, int)
                if not ok or isinstance(v, bool):
                    raise BadRequest(f"{where}.{k}: expected {FEATURES[k].__name__}, got {type(v).__name__}")

    def score_many(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in requests:
            self._check(r)
        with self._lock:
            self.calls.append(len(requests))
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for r in requests:
            ctx = r.get("context", {})
            raw = [self.bias + 0.01 * c.get("ad_id", ctx.get("ad_id", 0)) + 0.1 * c.get("bid", 0.0)
                   for c in r["candidates"]]
            p = [float("nan") if self.nan else 1 / (1 + math.exp(-x)) for x in raw]
            out.append({"version": self.version, "scores": {t: list(p) for t in self.tasks}})
        return out

    def score(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.score_many([request])[0]


def request(n: int = 3, surface: str | int = "feed", start: int = 0) -> dict[str, Any]:
    return {"surface": surface, "context": {"user_id": 7},
            "candidates": [{"ad_id": start + i, "bid": 0.5 * i} for i in range(n)]}


def post(port: int, body: bytes | str | dict[str, Any], ctype: str = "application/json",
         accept: str | None = None, timeout: float = 30.0) -> tuple[int, bytes, str]:
    """POST /predict; returns (status, body, content type)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": ctype}
    if accept:
        headers["Accept"] = accept
    try:
        conn.request("POST", "/predict", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("content-type", "")
    finally:
        conn.close()


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def fake_loader(path: Path, backend: str) -> FakePredictor:
    """Loads a fake version folder: fake.json = {"version", "bias", "nan"}; anything else fails."""
    spec = json.loads((Path(path) / "fake.json").read_text())
    return FakePredictor(spec["version"], spec.get("bias", 0.0), nan=spec.get("nan", False))


def publish_fake_version(run: Path, number: int, bias: float = 0.0, nan: bool = False,
                         corrupt: bool = False) -> Path:
    """RUN/versions/vNNNN with fake.json, manifest.json written last (= published), atomically as
    opengem.train.online publishes: a watcher polling while a plain write_text is half done sees the manifest
    twice (created, then written: two mtimes) and refuses a bad version twice (a load-dependent flake)."""
    d = run / "versions" / f"v{number:04d}"
    d.mkdir(parents=True, exist_ok=True)
    text = "{not json" if corrupt else json.dumps({"version": f"v{number:04d}", "bias": bias, "nan": nan})
    (d / "fake.json").write_text(text)
    manifest = {"version": number, "trained_through_ts": 1000 + number}
    atomic_write_text(d / "manifest.json", json.dumps(manifest))
    return d


def hashed_tiny_schema() -> FeatureSchema:
    """tiny.toml with ad_id's out-of-vocabulary ids hashed (a repair, as a VM schema declares): the schema
    the serving encode tests check requests against."""
    import dataclasses

    from opengem.data.schema import FeatureSchema

    s = FeatureSchema.load(Path(__file__).resolve().parents[1] / "configs" / "schemas" / "tiny.toml")
    sparse = tuple(dataclasses.replace(f, on_oov="hash") if f.name == "ad_id" else f for f in s.sparse)
    return dataclasses.replace(s, sparse=sparse)
