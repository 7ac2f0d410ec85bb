"""The server with a real model (GEM-tiny, a few training steps): JSON and Arrow requests built from real
rows score exactly as the Predictor does, its BadRequest becomes a 400, and hot swap over real published
versions takes a good one and refuses one whose checkpoint is corrupt while the old one keeps serving."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from opengem.bench.serve_bench import _publish, candidate_pool, make_request
from opengem.serve import arrow_io
from opengem.serve.predictor import Predictor
from opengem.serve.serve_cli import PredictorLoader
from opengem.serve.server import ServeConfig, build_server
from opengem.train.config import load_run_config
from opengem.train.trainer import train
from serve_helpers import get, post

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("serverun")
    train(load_run_config(TINY, ["train.progress=false", "train.steps=4"]), out)
    return out


@pytest.fixture(scope="module")
def requests_(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    data = load_run_config(run_dir / "config.toml").data.path
    rows, surfaces, ctx = candidate_pool(data, None, limit=64)
    return [json.loads(make_request(rows, surfaces, ctx, n, i)) for i, n in enumerate((1, 5, 17))]


def test_real_model_json_and_arrow_match_the_predictor(run_dir: Path, requests_: list[dict],  # type: ignore[type-arg]
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # the requests carry no ts, so both sides score at the server's clock (the hour-of-day features): one
    # frozen instant, or a second ticking between the two would change the scores
    monkeypatch.setattr("opengem.serve.encode.time.time_ns", lambda: 1_700_049_600 * 10**9)
    direct = Predictor.load(run_dir, "eager")
    cfg = ServeConfig(port=0, backend="eager")
    server = build_server(run_dir, cfg, [], PredictorLoader(cfg.max_candidates))
    port = server.start_in_thread()
    try:
        for req in requests_:
            status, body, _ = post(port, req)
            assert status == 200, body
            want = direct.score(req)
            assert json.loads(body) == want
            status, body, _ = post(port, arrow_io.encode_request(req), ctype=arrow_io.ARROW_STREAM,
                                   accept=arrow_io.ARROW_STREAM)
            assert status == 200 and arrow_io.decode_reply(body) == want
        bad = json.loads(json.dumps(requests_[1]))
        bad["candidates"][2]["ad_id"] = "seven"
        status, body, _ = post(port, bad)
        assert status == 400 and "ad_id" in json.loads(body)["error"]
    finally:
        server.stop()


def test_real_hot_swap_takes_good_versions_and_refuses_a_corrupt_one(run_dir: Path, tmp_path: Path,
                                                                    requests_: list[dict]) -> None:  # type: ignore[type-arg]
    run = tmp_path / "online"
    _publish(run, 1, run_dir)
    cfg = ServeConfig(port=0, backend="eager", poll_s=0.1)
    server = build_server(run, cfg, requests_[:2], PredictorLoader(cfg.max_candidates))
    port = server.start_in_thread()
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            statuses.append(post(port, requests_[2])[0])

    t = threading.Thread(target=client)
    t.start()
    try:
        bad = run / "versions" / "v0002"
        _publish(run, 2, run_dir)
        for f in bad.rglob("*.distcp"):  # the checkpoint's tensor data: garbage now
            f.write_bytes(b"\0corrupt")
        deadline = time.monotonic() + 120
        while 2 not in server.watcher.refused and time.monotonic() < deadline:
            time.sleep(0.1)
        refused = dict(server.watcher.refused)
        served_during = server.holder.version_number
        _publish(run, 3, run_dir)
        while server.holder.version_number != 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        t.join()
    health = json.loads(get(port, "/healthz")[1])
    server.stop()
    assert served_during == 1 and "load failed" in refused[2], refused
    assert server.holder.version_number == 3 and health["swaps"] == 1 and "2" in health["refused_versions"]
    assert set(statuses) == {200} and len(statuses) > 0
