"""How a batch of publishes is written: pika's frames joined into few pieces."""

from __future__ import annotations

import collections
from types import SimpleNamespace

from listener_router.broker._values import COALESCE_BYTES, coalesce_output


def _conn(frames: list[bytes]) -> SimpleNamespace:
    return SimpleNamespace(_transport=SimpleNamespace(_tx_buffers=collections.deque(frames)))


def test_frames_are_joined_in_order_into_pieces_of_bounded_size():
    frames = [bytes([i % 251]) * (i % 97 + 1) for i in range(30_000)]
    frames.insert(1234, b"y" * (COALESCE_BYTES * 2))  # a frame larger than a piece stays whole
    conn = _conn(frames)
    coalesce_output(conn)
    pieces = list(conn._transport._tx_buffers)
    assert b"".join(pieces) == b"".join(frames)
    assert 1 < len(pieces) < len(frames) / 1000
    assert b"y" * (COALESCE_BYTES * 2) in pieces  # the large frame on its own
    big = pieces.index(b"y" * (COALESCE_BYTES * 2))
    assert all(len(p) <= COALESCE_BYTES for i, p in enumerate(pieces) if i != big)
    # A piece closes only when the next frame would not fit: all but the one before the
    # large frame, and the last, are within a frame (97 bytes at most here) of full.
    assert all(len(p) > COALESCE_BYTES - 97 for i, p in enumerate(pieces[:-1])
               if i not in (big - 1, big))


def test_nothing_is_joined_where_pika_lays_its_buffers_out_otherwise():
    for conn in (SimpleNamespace(), SimpleNamespace(_transport=None),
                 SimpleNamespace(_transport=SimpleNamespace(_tx_buffers=[b"a", b"b"]))):
        coalesce_output(conn)  # no transport, or buffers that are not a deque: left alone
    assert conn._transport._tx_buffers == [b"a", b"b"]
    one = _conn([b"only"])
    coalesce_output(one)
    assert list(one._transport._tx_buffers) == [b"only"]
