"""Where ``opengem distill`` gets its teacher: an FM run's versions (read by :mod:`fm_runs`), and the side
table of its knowledge.

The no-leakage rule of ``versions.select_versions`` decides which version labels which example: only one
trained strictly before the example's ts, so rows as old as the FM's training data get no teacher (they
still train on labels).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from opengem.config import ConfigError
from opengem.data.dataset import Dataset
from opengem.data.schema import FeatureSchema, schema_differences
from opengem.errors import DatasetError, UsageError
from opengem.transfer.generate import SETTINGS, generate, read_side_table
from opengem.transfer.versions import VERSIONS, FMVersion, parse_fm_spec


def check_same_schema(fm: FeatureSchema | None, data: FeatureSchema, fm_spec: str, data_dir: str) -> None:
    """The FM reads --data with its own features: a dataset of another schema would not load into it."""
    if fm is None:
        return  # the checkpoint's fingerprint check still refuses a model of another shape
    diffs = schema_differences(fm, data)
    if diffs:
        raise UsageError(f"--fm {fm_spec} was trained on schema {fm.name!r}, but --data {data_dir} has "
                         f"schema {data.name!r}; they differ in {'; '.join(diffs)}: distil from data with "
                         "the FM's schema (choose the VM's features in [vm.schema])")


def side_table(spec: str, versions: list[FMVersion], data_dir: str, out: Path, parts: list[str], *,
               embeddings: tuple[str, ...], lag: int, batch_size: int, threads: int) -> pa.Table:
    """Generate (resumably, into ``out``) and read the FM's side table for ``parts``."""
    run, _ = parse_fm_spec(spec)
    published = (run / VERSIONS).is_dir()
    try:
        generate(spec, data_dir, out, lag=lag, partitions=",".join(parts), embeddings=embeddings,
                 batch_size=batch_size, threads=threads, versions=None if published else versions)
    except UsageError as e:  # generate names its own flag; here the recipe's key asked for them
        if str(e).startswith("--embeddings "):
            raise UsageError("distill.fm_embeddings " + str(e)[len("--embeddings "):]) from None
        raise
    return read_side_table(out, parts)


def given_side_table(knowledge: str, fm: str, data: Dataset, lag: int, parts: list[str],
                     embeddings: list[str]) -> pa.Table:
    """A side table made by ``opengem generate``: it must come from FM ``fm`` (the same pinned version, if
    any) and ``--lag``, on the rows of ``data``, and cover ``parts``. Rows are joined by example id, so a
    table made from another dataset would give every row another row's labels and embeddings."""
    path = Path(knowledge)
    run, pinned = parse_fm_spec(fm)
    try:
        made = json.loads((path / SETTINGS).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DatasetError(f"--knowledge {knowledge}: no {SETTINGS}: not a side table from `opengem generate`"
                           ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"--knowledge {knowledge}: {SETTINGS} unreadable ({type(e).__name__}); generate "
                           "it again") from None
    if not isinstance(made, dict) or Path(made.get("fm", "")) != run.resolve():
        fm_made = made.get("fm") if isinstance(made, dict) else None
        raise UsageError(f"--knowledge {knowledge} was generated from FM {fm_made}, not --fm {run}: "
                         "pass the FM it came from")
    written_at = (data.marker or {}).get("written_at")
    same_rows = (made.get("data_written_at") == written_at if written_at and made.get("data_written_at")
                 else Path(made.get("data", "")) == data.root.resolve())
    differ = [what for what, ok in (
        (f"--data (it was made from {made.get('data')}, written at {made.get('data_written_at')}; --data "
         f"{data.root} was written at {written_at})", same_rows),
        (f"the pinned version (it has {made.get('pinned_version')}, --fm pins {pinned})",
         made.get("pinned_version") == pinned),
        (f"distill.lag (it has --lag {made.get('lag')}, the recipe {lag})", made.get("lag") == lag),
    ) if not ok]
    if differ:
        raise UsageError(f"--knowledge {knowledge}: made with other settings than this distillation: "
                         f"{'; '.join(differ)}; generate it again with these, or leave out --knowledge")
    side = read_side_table(path, parts)
    missing = [e for e in embeddings if f"fm_{e}" not in side.column_names]
    if missing:
        raise ConfigError(f"distill.fm_embeddings: --knowledge {knowledge} has no {missing} (generate it "
                          f"with --embeddings {','.join(embeddings)})")
    return side


def teacher_coverage(side: pa.Table) -> dict[str, Any]:
    """How many rows have a teacher, and which FM versions labelled them (for the summary)."""
    ver = side.column("fm_version").to_numpy()
    used = sorted({int(v) for v in ver if v >= 0})
    return {"rows": int(len(ver)), "rows_with_teacher": int((ver >= 0).sum()), "fm_versions_used": used}
