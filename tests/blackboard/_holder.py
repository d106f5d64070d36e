"""A lease holder in its own OS process, driven over stdin/stdout by the tests.

    python tests/blackboard/_holder.py URL OWNER LEASE_SECONDS RECORD

Loads RECORD, sets ``who = OWNER``, prints ``LOADED``, then obeys lines on
stdin: ``commit`` (prints ``COMMITTED`` or ``STALE <json holders>``),
``quit``.  Tests SIGKILL it to play a crashed process.
"""

from __future__ import annotations

import json
import sys

from blackboard import Blackboard, StaleRecordError


def main() -> None:
    url, owner, lease, rid = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    bb = Blackboard.connect(url, owner=owner, lease_seconds=lease)
    bb.load(rid)
    bb.set_literal(rid, "who", owner)
    print("LOADED", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "commit":
            try:
                bb.commit(rid)
                print("COMMITTED", flush=True)
            except StaleRecordError as e:
                print("STALE", json.dumps(e.holders), flush=True)
        elif command == "quit":
            break


if __name__ == "__main__":
    main()
