"""The Taobao DMR sample's layout, shared by the tests that import it (``../shared/data`` or
``$OPENGEM_DATA``): 267 headerless columns, each history (behaviour type, category, brand) spread over 50
columns with 0 where it is shorter, the mask columns marking the real slots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("OPENGEM_DATA") or ROOT.parent / "shared" / "data")
DMR = DATA / "taobao_ad_dmr_sample" / "alimama_sampled_train.txt"
COLUMNS = ([f"{kind}{j}" for kind in ("btag", "cate", "brand", "mask", "match") for j in range(50)]
           + ["uid", "cms_segid", "cms_group_id", "gender", "age_level", "pvalue_level", "shopping_level",
              "occupation", "new_user_class_level", "adgroup_id", "cate_id", "campaign_id", "customer_id",
              "brand", "price", "pid", "label"])
needs_dmr = pytest.mark.skipif(not DMR.exists(), reason=f"real data not found at {DMR} (set $OPENGEM_DATA or "
                                                        "provide ../shared/data)")


def real_event_counts() -> dict[int, int]:
    """Row number -> how many of its 50 category slots hold a real event (mask 1, id not 0)."""
    cells = [line.rstrip("\n").split(",") for line in DMR.open()]
    return {i: sum(c[150 + j] == "1" and c[50 + j] != "0" for j in range(50)) for i, c in enumerate(cells)}
