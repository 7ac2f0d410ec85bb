"""benchmarks/device/fatbin_keep_arch.py: what the lent GPU's fbgemm-gpu is packed with (no GPU needed)."""

import importlib.util
import struct
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("fatbin_keep_arch",
                                                  REPO / "benchmarks" / "device" / "fatbin_keep_arch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    body = b""
    for kind, arch, payload in entries:
        head = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + bytes(12) + struct.pack("<I", arch)
        body += head + bytes(64 - len(head)) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_other_archs_are_zeroed_in_place_and_a_fatbin_without_the_arch_is_left_whole(tmp_path):
    a80, a90, ptx = b"\x11" * 40, b"\x22" * 24, b"\x33" * 16
    lib = (b"ELF-ish host code" + _fatbin([(2, 80, a80), (2, 90, a90), (1, 90, ptx)]) + b"more host code"
           + _fatbin([(1, 75, b"\x44" * 8)]) + b"\x50\xed\x55\xba junk that only looks like a header")
    path = tmp_path / "lib.so"
    path.write_bytes(lib)
    sizes, zeroed = _tool().keep_arch(str(path), 90)
    out = path.read_bytes()
    assert len(out) == len(lib) and zeroed == len(a80)
    assert sizes == {(2, 80): 40, (2, 90): 24, (1, 90): 16, (1, 75): 8}
    assert a80 not in out and bytes(40) in out and a90 in out and ptx in out
    assert b"\x44" * 8 in out  # no sm_90 entry in that fatbin: kept for the driver
    assert out == lib.replace(a80, bytes(40))  # nothing else changed
