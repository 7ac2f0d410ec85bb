"""Zero every CUDA cubin/PTX in a shared library's fatbins that is not for one GPU arch, in place.

Why: the device machine lent to some sessions (one H200, sm_90) has PyTorch but not fbgemm-gpu or TorchRec,
and nothing can be downloaded there; a call carries at most 64 MiB. fbgemm-gpu 1.6.0's CUDA wheel is 443 MiB
(2.4 GB unpacked, cubins for sm_80, sm_90 and sm_100). Zeroing the other archs' payloads keeps every size and
offset (so the ELF is untouched) and the zeros compress away: the wheel then packs to ~79 MiB of xz (two
calls).
A fatbin with no entry for the arch is left whole (the driver may need its PTX).

    python benchmarks/device/fatbin_keep_arch.py LIB.so [ARCH=90]

Fatbin layout (public reverse engineering, e.g. cuda-fatbin-decompression): a 16-byte header (magic
0xBA55ED50, version, header size, payload size), then entries of (kind 1 PTX / 2 ELF, header size, payload
size, ..., arch at byte 28) each followed by its payload.
"""

from __future__ import annotations

import mmap
import struct
import sys
from collections import Counter

MAGIC = struct.pack("<I", 0xBA55ED50)


def fatbins(mm: mmap.mmap) -> list[list[tuple[int, int, int, int]]]:
    """Every well-formed fatbin in the file: its entries as (kind, arch, payload offset, payload size)."""
    found, pos = [], 0
    while (i := mm.find(MAGIC, pos)) >= 0:
        _, hsz, size = struct.unpack_from("<HHQ", mm, i + 4)
        start, end = i + 16, i + 16 + size
        if hsz != 16 or size == 0 or end > len(mm):
            pos = i + 4
            continue
        entries, p = [], start
        while p < end:
            kind, _, ehs, psize = struct.unpack_from("<HHIQ", mm, p)
            arch = struct.unpack_from("<I", mm, p + 28)[0]
            if kind not in (1, 2) or ehs < 64 or p + ehs + psize > end:
                entries = []
                break
            entries.append((kind, arch, p + ehs, psize))
            p += ehs + psize
        if entries:
            found.append(entries)
            pos = end
        else:
            pos = i + 4
    return found


def keep_arch(path: str, arch: int) -> tuple[Counter, int]:
    """Zero the other archs' payloads in fatbins that have one for ``arch``; bytes by (kind, arch), zeroed."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        sizes, zeroed = Counter(), 0
        for entries in fatbins(mm):
            for kind, a, _, size in entries:
                sizes[(kind, a)] += size
            if any(a == arch for _, a, _, _ in entries):
                for _, a, off, size in entries:
                    if a != arch:
                        mm[off:off + size] = bytes(size)
                        zeroed += size
        mm.flush()
    return sizes, zeroed


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.splitlines()[2].strip())
    sizes, zeroed = keep_arch(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 90)
    kinds = {1: "ptx", 2: "elf"}
    found = ", ".join(f"{kinds[k]} sm_{a} {v / 2**20:.0f} MiB" for (k, a), v in sorted(sizes.items()))
    print(sys.argv[1], found, f"-> zeroed {zeroed / 2**20:.0f} MiB")
