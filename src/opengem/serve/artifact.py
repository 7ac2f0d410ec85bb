"""The export artifact: one folder that holds everything needed to score raw requests, and nothing to trust.

Layout of ``DIR`` (written by :func:`write_artifact`, read by :func:`read_artifact`):

- ``manifest.json``: format tag and version, the model version string, ``trained_through_ts``, where it
  came from (run, checkpoint, step), the backends it carries, and the sha256 of every other file;
- ``model.toml``: the resolved ``[model]`` config the weights belong to (``ModelConfig``);
- ``schema.toml``: the dataset's FeatureSchema (vocabulary sizes, OOV/NaN/overflow policies, surfaces,
  tasks), the contract the request encoder applies exactly as the loader does;
- ``encoding.json``: how raw values become canonical ones (``"ids"``: the values already are ids, as the
  simulator's; ``"table"``: the importer's fitted encoders of a converted dataset, whose vocabularies are
  ``_encoders/<feature>.parquet`` files beside it, see :mod:`opengem.data.adapters.encoders_io`);
- ``weights.pt``: ``torch.save`` of a flat ``{name: tensor}`` dict, read back with ``weights_only=True``;
- ``program.pt2`` (``--backend export``): the ``torch.export`` program, plain lookups, dynamic batch;
- ``aoti.pt2`` (``--backend aoti``): the AOTInductor package compiled for this machine's CPU.

Why a digest: an artifact is copied between machines and hot-swapped into a live server; a truncated
copy or a file changed after export must fail loudly at load time, not serve garbage. Loading refuses a
file whose sha256 differs from the manifest's (vocabulary files included), a file the manifest does not
list among the known names,
and anything that is not a plain dict of tensors in ``weights.pt``. The manifest travels with the files,
so the digest guards integrity, not authenticity: ``aoti.pt2`` is native code, so load an AOTI artifact
only from a folder you exported or trust (the eager and export backends execute no code from the folder).
Written to ``DIR.tmp-<pid>`` and renamed, so a reader never sees half an artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from opengem.data.adapters.common import AdapterError
from opengem.data.adapters.encoders_io import KIND as TABLE
from opengem.data.adapters.encoders_io import VOCAB_FILE, load_vocabularies, save_vocabularies
from opengem.data.commit import OutputExistsError
from opengem.serve.errors import ArtifactError
from opengem.serve.hot_swap import VERSIONS
from opengem.train.run_dir import CONFIG_FILE

FORMAT = "opengem-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODEL_CONFIG = "model.toml"
SCHEMA = "schema.toml"
ENCODING = "encoding.json"
WEIGHTS = "weights.pt"
PROGRAM = "program.pt2"
AOTI = "aoti.pt2"
KNOWN_FILES = (MODEL_CONFIG, SCHEMA, ENCODING, WEIGHTS, PROGRAM, AOTI)
BACKEND_FILES = {"export": PROGRAM, "aoti": AOTI}


@dataclass
class Artifact:
    """An export artifact, in memory or read back from its folder (``path`` None when only in memory)."""

    manifest: dict[str, Any]
    model_config: str  # TOML text of the [model] section
    schema: str  # TOML text of the FeatureSchema
    encoding: dict[str, Any]
    weights: dict[str, torch.Tensor]
    path: Path | None = None
    programs: dict[str, Path] = field(default_factory=dict)  # backend -> file (export, aoti)

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    @property
    def trained_through_ts(self) -> int | None:
        tt = self.manifest.get("trained_through_ts")
        return None if tt is None else int(tt)

    @property
    def backends(self) -> list[str]:
        return ["eager", *self.programs]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_out(out: str | Path, force: bool) -> Path:
    """``out`` if an artifact may be written there: new, or (with ``force``) an artifact already; checked
    before any work so that a long export does not fail at its end."""
    out = Path(out)
    if out.exists() and not force:  # a usage error (exit 2), as every other command's existing --out
        raise OutputExistsError(f"--out {out}: exists (choose another folder or pass --force to replace it)")
    if out.exists() and not is_artifact(out):
        raise OutputExistsError(f"--out {out}: exists and is not an export artifact (no {MANIFEST}); "
                                "not replaced")
    return out


def write_artifact(out: str | Path, artifact: Artifact, programs: dict[str, Path] | None = None,
                   force: bool = False) -> Path:
    """Write ``artifact`` (and the program files ``programs``: backend -> a file made by export) to ``out``
    atomically; ``force`` replaces an existing artifact folder."""
    out = check_out(out, force)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / MODEL_CONFIG).write_text(artifact.model_config, encoding="utf-8")
        (tmp / SCHEMA).write_text(artifact.schema, encoding="utf-8")
        encoding = artifact.encoding
        if encoding.get("kind") == TABLE:  # vocabularies as Parquet files beside it, digested below
            encoding = save_vocabularies(encoding, tmp)
        (tmp / ENCODING).write_text(json.dumps(encoding, indent=2), encoding="utf-8")
        torch.save({k: v.detach().contiguous().cpu() for k, v in artifact.weights.items()}, tmp / WEIGHTS)
        for backend, src in (programs or {}).items():
            shutil.copyfile(src, tmp / BACKEND_FILES[backend])
        files = {p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {**artifact.manifest, "format": FORMAT, "format_version": FORMAT_VERSION,
                    "backends": ["eager", *(programs or {})], "files": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def is_artifact(path: str | Path) -> bool:
    """Whether ``path`` is an export artifact folder (a version folder's manifest.json is not one)."""
    m = Path(path) / MANIFEST
    try:
        return m.is_file() and json.loads(m.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def refuse_damaged(path: str | Path) -> None:
    """Raise the manifest's own ArtifactError for a folder that is meant as an export artifact (it has a
    manifest.json, and no config.toml as a run has) but whose manifest cannot be read. Without this, such
    a folder is not :func:`is_artifact` and is then read as a run folder: "no config.toml"."""
    p = Path(path)
    if (p / MANIFEST).is_file() and not (p / CONFIG_FILE).is_file() and p.parent.name != VERSIONS:
        read_manifest(p)


def read_manifest(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    m = path / MANIFEST
    if not m.is_file():
        raise ArtifactError(f"{path}: not an export artifact (no {MANIFEST}); make one with opengem export")
    try:
        manifest = json.loads(m.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{m}: unreadable ({type(e).__name__}: {e}); export the model again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{m}: not an opengem export manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{m}: artifact format version {manifest.get('format_version')!r}, this opengem "
                            f"reads version {FORMAT_VERSION}; export the model again")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ArtifactError(f"{m}: has no file digests")
    unknown = [n for n in files if n not in KNOWN_FILES and not VOCAB_FILE.fullmatch(n)]
    if unknown:
        raise ArtifactError(f"{m}: lists file(s) {unknown} that an artifact never holds; not loaded")
    for need in (MODEL_CONFIG, SCHEMA, ENCODING, WEIGHTS):
        if need not in files:
            raise ArtifactError(f"{m}: lists no {need}; the artifact is incomplete")
    if "version" not in manifest:
        raise ArtifactError(f"{m}: has no model version")
    return manifest


def verify_files(path: Path, manifest: dict[str, Any]) -> None:
    """Every listed file exists with the recorded sha256 (a changed, truncated or missing file is refused)."""
    for name, digest in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise ArtifactError(f"{path}: {name} is missing (the manifest lists it); copy the whole folder")
        if sha256_file(f) != digest:
            raise ArtifactError(f"{f}: sha256 differs from the manifest's; the file changed after export "
                                "(not loaded: export again or restore a good copy)")


def read_weights(f: Path) -> dict[str, torch.Tensor]:
    """``weights.pt`` as a flat dict of tensors, with torch's weights-only unpickler (no code runs)."""
    try:
        weights = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # a weights-only refusal or a corrupt zip: never a reason to trust the file
        raise ArtifactError(f"{f}: not a plain dict of tensors ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None
    if not isinstance(weights, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()):
        raise ArtifactError(f"{f}: not a plain dict of tensors")
    return weights


def read_artifact(path: str | Path) -> Artifact:
    """Read and verify an artifact folder (digests first, then the files)."""
    path = Path(path)
    manifest = read_manifest(path)
    verify_files(path, manifest)
    try:
        encoding = json.loads((path / ENCODING).read_text(encoding="utf-8"))
        model_config = (path / MODEL_CONFIG).read_text(encoding="utf-8")
        schema = (path / SCHEMA).read_text(encoding="utf-8")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: unreadable artifact file ({type(e).__name__}: {e})") from None
    if isinstance(encoding, dict) and encoding.get("kind") == TABLE:
        encoding = _table_encoding(path, encoding, manifest)
    programs = {b: path / f for b, f in BACKEND_FILES.items() if f in manifest["files"]}
    return Artifact(manifest, model_config, schema, encoding, read_weights(path / WEIGHTS), path, programs)


def _table_encoding(path: Path, encoding: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """encoding.json with each vocabulary's values read from its file; every such file must be one the
    manifest lists (and so was digest-checked), else the artifact is refused."""
    vocabs = encoding.get("vocabs")
    if isinstance(vocabs, dict):
        for name, v in vocabs.items():
            rel = v.get("file") if isinstance(v, dict) else None
            if rel is not None and rel not in manifest["files"]:
                raise ArtifactError(f"{path / ENCODING}: vocabulary {name!r} file {rel!r} is not in the "
                                    "manifest; not loaded (export again)")
    try:
        return load_vocabularies(encoding, path, str(path / ENCODING))
    except AdapterError as e:
        raise ArtifactError(str(e)) from None
