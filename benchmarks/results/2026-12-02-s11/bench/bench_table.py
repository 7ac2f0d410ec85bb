"""The README's before/after table from the train_small_d32_<precision>_<cpu_linear>.{json,txt} files here."""

import glob
import json
import re

ROW = re.compile(r"^(gem|dlrm|dcnv2)\s+(\w+)\s+[\d.]+\s+([\d,]+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)%\s+"
                 r"([\d.]+)%\s+([\d.]+)%\s+([\d.]+)")
rows: dict[tuple[str, str, str], list[dict]] = {}
for f in sorted(glob.glob("train_small*.json")):
    prec, kern = f[:-5].rsplit("_", 2)[1:]
    for r in json.load(open(f))["runs"]:
        rows.setdefault((r["model"], prec, kern), []).append(r)
for f in sorted(glob.glob("train_small*.txt")):
    prec, kern = f[:-4].rsplit("_", 2)[1:]
    for line in open(f):
        m = ROW.match(line)
        if m:
            rows.setdefault((m[1], prec, kern), []).append(
                {"examples_per_s": float(m[3].replace(",", "")), "peak_flops": float(m[4]) * 1e9,
                 "mfu": float(m[5]) / 100, "mfu_full": float(m[6]) / 100, "peak_mem_mb": float(m[8])})


def col(rs: list[dict], key: str, fmt: str, scale: float = 1.0) -> str:
    return ", ".join(format(r[key] * scale, fmt) for r in rs if key in r)


print("| model | precision | dense layers | examples/s (run 1, run 2) | MFU executed | MFU full length "
      "| peak GFLOP/s | peak MB |")
print("|---|---|---|---|---|---|---|---|")
for model in ("gem", "dlrm", "dcnv2"):
    for prec in ("fp32", "bf16"):
        for kern in ("pytorch", "auto"):
            rs = rows[(model, prec, kern)]
            print(f"| {model} | {prec} | {'BLAS' if kern == 'pytorch' else 'auto (oneDNN)'} | "
                  f"{col(rs, 'examples_per_s', ',.0f')} | {col(rs, 'mfu', '.1f', 100)} % | "
                  f"{col(rs, 'mfu_full', '.1f', 100)} % | {col(rs, 'peak_flops', '.0f', 1e-9)} | "
                  f"{col(rs, 'peak_mem_mb', '.0f')} |")
