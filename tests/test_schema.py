import tomllib
from pathlib import Path

import pytest

from opengem.data.schema import FeatureSchema, SchemaError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "schemas" / "tiny.toml"


def tiny_dict() -> dict:
    return tomllib.loads(TINY.read_text())


def test_tiny_schema_roundtrips_through_toml():
    s = FeatureSchema.load(TINY)
    assert FeatureSchema.from_dict(tomllib.loads(s.to_toml())) == s
    assert s.tables()["item"] == (50, 8)  # ad_id and hist.item share one table
    assert "hist__item" in s.feature_columns()


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d["sparse"][0].update(vocab_size=3), "unknown key 'vocab_size'"),
        (lambda d: d["sparse"][1].update(name="user_id"), "duplicate name 'user_id'"),
        (lambda d: d["task"][0].update(column=""), "task[0].column"),
        (lambda d: d["sparse"][0].update(vocab=-5), "sparse[0].vocab"),
        (lambda d: d["sequence"][0].update(max_len=0), "sequence[0].max_len"),
        (lambda d: d.update(surfacez=["a"]), "unknown key 'surfacez' (did you mean 'surfaces'? allowed: "),
        (lambda d: d.pop("task"), "missing required key 'task'"),
        (lambda d: d["sparse"][0].update(pooling="max"), "sparse[0].pooling"),
        (lambda d: d["sparse"][0].update(dim="8"), "sparse[0].dim: wrong type"),
        (lambda d: d["sequence"][0]["fields"][0].update(dim=4), "different dims"),
    ],
)
def test_schema_mistakes_name_the_key(mutate, needle):
    d = tiny_dict()
    mutate(d)
    with pytest.raises(SchemaError) as e:
        FeatureSchema.from_dict(d, "tiny.toml")
    assert needle in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SchemaError, match="not found"):
        FeatureSchema.load(tmp_path / "nope.toml")
