"""Each run's wall seconds (study.log) against the same run's in session 44, in this run's finishing order, by
blocks of 25 runs: where in the study the two runs' speeds differed.

    python timeline.py study.log ../../2026-12-06-s44/study/study.log
"""

import re
import statistics
import sys


def runs(path: str) -> list[tuple[str, float]]:
    out = []
    for line in open(path):
        m = re.match(r"isoflop: \[\d+\] (\S+) .*?, ([\d.]+)s$", line.strip())
        if m:
            out.append((m.group(1), float(m.group(2))))
    return out


this, then = runs(sys.argv[1]), dict(runs(sys.argv[2]))
for i in range(0, len(this), 25):
    block = this[i:i + 25]
    r = [s / then[n] for n, s in block]
    print(f"runs {i + 1:3d}-{i + len(block):3d}: this / session 44 median {statistics.median(r):.3f} "
          f"(run-seconds {sum(s for _, s in block):7.0f} vs {sum(then[n] for n, _ in block):7.0f})")
