"""Memory that follows the bodies held: large allocations are mapped, and given back freed.

glibc serves an allocation over its mmap threshold (128 KiB) from a mapping
of its own, returned to the system when freed; but the threshold rises to
the size of any such block freed, so after the first 900 KB message body
is released every later one comes from the heap, whose freed pages the
process keeps.  A service that held 64 MB of bodies then stays at several
times that.  :func:`map_large_bodies` fixes the threshold (glibc's
``mallopt(M_MMAP_THRESHOLD)``, which also stops it moving): what a process
holds of message bodies is what its resident size shows, and what bounds
them (``max_inflight_bytes``) bounds it.  Elsewhere than glibc it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["map_large_bodies"]

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3       # glibc's malloc.h
THRESHOLD = 128 * 1024


def map_large_bodies() -> bool:
    """Fix this process's mmap threshold at 128 KiB (glibc); True when it was set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    try:
        return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD))
    except Exception as e:  # not glibc after all
        log.debug("mallopt failed: %s", e)
        return False
