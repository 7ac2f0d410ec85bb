"""The Python Predictor: raw feature values for one request -> one score per candidate and task.

``Predictor.load(DIR)`` reads an export artifact (digests verified, weights read without unpickling
objects) and picks a backend: ``eager`` (the model rebuilt from its config, TorchRec tables as trained),
``export`` (the ``torch.export`` program) or ``aoti`` (the AOTInductor package); ``auto`` takes the fastest
the artifact carries. ``Predictor.load(RUN)`` exports a training run (or one of its versions) first.

Requests are encoded by :class:`~opengem.serve.encode.RequestEncoder`, i.e. by the loader's own checks and
batching, so the model sees exactly what it saw in training. ``score_many`` runs ONE forward pass over
every candidate of every request (what part B's dynamic batching calls); the HTTP server maps
:class:`BadRequest` to a 4xx.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch._inductor import aoti_load_package

from opengem.data.batch import Batch
from opengem.data.schema import FeatureSchema
from opengem.serve.artifact import AOTI, Artifact, is_artifact, read_artifact, refuse_damaged
from opengem.serve.encode import DEFAULT_MAX_CANDIDATES, RequestEncoder
from opengem.serve.errors import ArtifactError, BadRequest
from opengem.serve.export import (
    dataset_encoding,
    export_model,
    export_program,
    flat_inputs,
    flat_tensor_chunks,
    load_run,
    make_artifact,
    model_from_artifact,
)
from opengem.transfer.versions import VERSION_NAME, VERSIONS

BACKEND_CHOICES = ("auto", "eager", "export", "aoti")
# AOTI scores a merged batch of more rows in slices of this many (export.flat_tensor_chunks); 0 = one call.
# Off by default: measured per 512 candidates, slices of 2,048 rows cost 2-11 % less at 8,192 rows but up to
# 13 % more at 4,096 (about what the server merges at 16 clients), within this machine's run-to-run noise.
AOTI_CHUNK_ROWS = 0


class Predictor:
    """Scores requests ``{"surface", "context", "candidates"}`` with one exported model version."""

    version: str
    trained_through_ts: int | None
    tasks: list[str]
    surfaces: list[str]
    takes_arrow_tables = True  # a request's candidates may be a pyarrow.Table (an Arrow body, as columns)

    def __init__(self, artifact: Artifact, backend: str = "auto",
                 max_candidates: int = DEFAULT_MAX_CANDIDATES,
                 aoti_chunk_rows: int = AOTI_CHUNK_ROWS) -> None:
        if backend not in BACKEND_CHOICES:
            raise ArtifactError(f"backend {backend!r}: choose one of {', '.join(BACKEND_CHOICES)}")
        self.artifact = artifact
        self.model, self.schema, self.model_config = model_from_artifact(artifact)
        self.version = artifact.version
        self.trained_through_ts = artifact.trained_through_ts
        self.tasks = self.schema.task_names
        self.surfaces = list(self.schema.surfaces)
        self.encoder = RequestEncoder(self.schema, max_candidates, artifact.encoding)
        self.backend = _choose(backend, artifact)
        self.aoti_chunk_rows = aoti_chunk_rows
        self._forward = self._make_forward(self.backend)
        self._lock = threading.Lock()  # one forward at a time per Predictor (AOTI runners are not reentrant)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, backend: str = "auto", max_candidates: int = DEFAULT_MAX_CANDIDATES,
             aoti_chunk_rows: int = AOTI_CHUNK_ROWS) -> Predictor:
        """An export dir, or a run (``RUN``, ``RUN@version``, or a published ``RUN/versions/vNNNN``
        folder) exported on the fly: in memory for eager/auto, into a private temporary folder for
        export/aoti (an AOTI compile takes minutes on a small CPU)."""
        p = Path(path)
        if is_artifact(p):
            return cls(read_artifact(p), backend, max_candidates, aoti_chunk_rows)
        refuse_damaged(p)
        if backend not in BACKEND_CHOICES:
            raise ArtifactError(f"backend {backend!r}: choose one of {', '.join(BACKEND_CHOICES)}")
        spec = str(path)
        if p.parent.name == VERSIONS and VERSION_NAME.fullmatch(p.name):
            spec = f"{p.parent.parent}@{int(p.name[1:])}"
        r = load_run(spec)
        encoding = dataset_encoding(r.data_path)
        if backend in ("auto", "eager"):
            art = make_artifact(r.model, r.schema, r.cfg, r.version, r.trained_through_ts, r.source, encoding)
            return cls(art, "eager", max_candidates, aoti_chunk_rows)
        tmp = tempfile.TemporaryDirectory(prefix="opengem-predictor-")
        out = Path(tmp.name) / "artifact"
        export_model(r.model, r.schema, r.cfg, out, backend=backend, version=r.version,
                     trained_through_ts=r.trained_through_ts, source=r.source, encoding=encoding)
        predictor = cls(read_artifact(out), backend, max_candidates, aoti_chunk_rows)
        predictor._tmp = tmp  # the package files live as long as the Predictor
        return predictor

    # ------------------------------------------------------------------ scoring
    def validate(self, request: dict[str, Any]) -> int:
        """Check one request without scoring it (a server can refuse it before batching); its candidates."""
        return self.encoder.columns_of(request).n

    def encode(self, requests: list[dict[str, Any]]) -> tuple[Batch, list[int]]:
        """The Batch the model sees for ``requests`` (the loader's encoding) and each one's candidates."""
        if not isinstance(requests, list):
            raise BadRequest(f"requests must be a list of request objects, got {type(requests).__name__}")
        return self.encoder.batch(requests)

    def logits(self, batch: Batch) -> torch.Tensor:
        """[B, T] logits of a Batch through this Predictor's backend."""
        with self._lock, torch.inference_mode():
            return self._forward(batch).float()

    def score(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request -> ``{"version": str, "scores": {task: [float per candidate]}}``."""
        return self.score_many([request])[0]

    def score_many(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Many requests -> one reply each, with ONE forward pass over all their candidates."""
        batch, counts = self.encode(requests)
        # one list of floats per task (the [B, T] transpose, then tolist), sliced per request: a list per
        # row (tolist of [B, T]) cost 1.2 ms at 8192 rows plus the garbage collections its 8192 lists set off
        per_task = torch.sigmoid(self.logits(batch)).numpy().T.tolist()
        out, start = [], 0
        for n in counts:
            out.append({"version": self.version,
                        "scores": {t: per_task[j][start:start + n] for j, t in enumerate(self.tasks)}})
            start += n
        return out

    # ------------------------------------------------------------------ backends
    def _make_forward(self, backend: str) -> Callable[[Batch], torch.Tensor]:
        if backend == "eager":
            model = self.model
            return lambda b: model(b).logits
        if backend == "export":
            program = self.artifact.programs.get("export")
            module = (torch.export.load(str(program)) if program is not None
                      else export_program(self.model, self.schema)).module()
            return _flat_runner(module, self.schema)
        try:
            runner = aoti_load_package(str(self.artifact.programs["aoti"]))
        except Exception as e:
            where = self.artifact.path / AOTI if self.artifact.path else AOTI
            raise ArtifactError(f"{where}: cannot load the "
                                f"AOTI package on this machine ({type(e).__name__}: {str(e)[:200]}); "
                                "export again here") from None
        return _aoti_runner(runner, self.schema, self.aoti_chunk_rows)


def _aoti_runner(package: Any, schema: FeatureSchema, chunk_rows: int = 0) -> Callable[[Batch], torch.Tensor]:
    """An AOTInductor package's forward, called through its loader with the inputs already flat
    (:func:`~opengem.serve.export.flat_tensors`), skipping the pytree flattening its ``__call__`` does on
    every call; a package object without that loader (another torch) is called the documented way.
    A batch of more than ``chunk_rows`` rows runs in slices of that many (``flat_tensor_chunks`` says
    why); ``0`` = one call whatever the size."""
    loader = getattr(package, "loader", None)
    if loader is None or not hasattr(loader, "boxed_run") or not hasattr(loader, "get_call_spec"):
        return _flat_runner(package, schema)
    out_spec = pytree.treespec_loads(loader.get_call_spec()[1])

    def run(flat: list[torch.Tensor]) -> torch.Tensor:
        return pytree.tree_unflatten(loader.boxed_run(flat), out_spec)

    def forward(b: Batch) -> torch.Tensor:
        flats = flat_tensor_chunks(b, schema, chunk_rows)
        return run(flats[0]) if len(flats) == 1 else torch.cat([run(flat) for flat in flats])

    return forward


def _flat_runner(fn: Callable[..., torch.Tensor] | nn.Module, schema: FeatureSchema
                 ) -> Callable[[Batch], torch.Tensor]:
    return lambda b: fn(*flat_inputs(b, schema))


def _choose(backend: str, art: Artifact) -> str:
    if backend == "auto":
        return "aoti" if "aoti" in art.programs else "export" if "export" in art.programs else "eager"
    if backend == "aoti" and "aoti" not in art.programs:
        raise ArtifactError(f"{art.path or 'artifact'}: has no AOTI package (export it with --backend aoti)")
    return backend
