"""Stream a large attachment into storage and back out; report peak-memory growth.

    python tests/blackboard/_bigfile.py URL SIZE_BYTES

Prints one JSON line: {"write_growth_mb", "read_growth_mb", "match", "size"}.
Peak resident memory is VmHWM from /proc/self/status, measured after a
warm-up round trip (so imports, pools and buffers are in the baseline).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys

from blackboard import Blackboard

BLOCK = 1 << 20


def peak_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class Source(io.RawIOBase):
    """``size`` pseudo-random bytes, made on the fly (never all in memory)."""

    def __init__(self, size: int):
        self.left = size
        self.number = 0
        self.block = os.urandom(BLOCK)
        self.pending = b""
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        if not self.pending and self.left > 0:
            chunk = (self.number.to_bytes(8, "big") + self.block[8:])[: self.left]
            self.number += 1
            self.left -= len(chunk)
            self.digest.update(chunk)
            self.pending = chunk
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        self.pending = self.pending[size:]
        return size


def round_trip(bb: Blackboard, rid: str, size: int) -> tuple[str, str]:
    source = Source(size)
    bb.create(rid)
    bb.set_attachment_from_stream(rid, "blob", io.BufferedReader(source, BLOCK))
    bb.commit(rid)
    bb.load(rid)
    digest = hashlib.sha256()
    with bb.get_attachment_stream(rid, "blob") as stream:
        while chunk := stream.read(BLOCK):
            digest.update(chunk)
    bb.invalidate(rid)
    return source.digest.hexdigest(), digest.hexdigest()


def main() -> None:
    url, size = sys.argv[1], int(sys.argv[2])
    with Blackboard.connect(url) as bb:
        round_trip(bb, "warm-up", 12 * BLOCK)
        base = peak_mb()
        source = Source(size)
        bb.create("big")
        bb.set_attachment_from_stream("big", "blob", source)
        bb.commit("big")
        after_write = peak_mb()
        bb.load("big")
        digest = hashlib.sha256()
        with bb.get_attachment_stream("big", "blob") as stream:
            while chunk := stream.read(BLOCK):
                digest.update(chunk)
        after_read = peak_mb()
        stored = bb.store.attachment_size("big", "blob")
    print(json.dumps({"write_growth_mb": round(after_write - base, 1),
                      "read_growth_mb": round(after_read - base, 1),
                      "match": digest.hexdigest() == source.digest.hexdigest(),
                      "size": stored}))


if __name__ == "__main__":
    main()
