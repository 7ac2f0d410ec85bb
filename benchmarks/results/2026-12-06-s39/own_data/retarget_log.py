"""A click log where the one signal is retargeting: a user clicks an ad it has met before (its id is in the
'^'-joined history) with p 0.6, any other ad with p 0.05. Written to probe `convert table`'s joined histories
and shared tables end to end (session 39), not as a benchmark of the simulator.

    python retarget_log.py OUT.csv [ROWS]
"""

from __future__ import annotations

import random
import sys


def main() -> None:
    out, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    rng = random.Random(7)
    lines = ["user_id,ad_id,hist_ad_id,click"]
    for _ in range(rows):
        user, ad = rng.randrange(5000), rng.randrange(300)
        hist = [str(rng.randrange(300)) for _ in range(rng.randrange(0, 21))]
        p = 0.6 if str(ad) in hist else 0.05
        lines.append(f"{user},{ad},{'^'.join(hist)},{int(rng.random() < p)}")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
