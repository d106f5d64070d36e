"""The lab's delay relay: what ``tc qdisc … netem delay`` would do, for one host's TCP.

``scripts/lab.sh delay A B --ms N`` starts it on host A and has nftables
redirect A's new TCP connections to B's addresses to it.  For each, it looks
up where the connection was going (``SO_ORIGINAL_DST``), connects there
itself (its packets carry ``--mark``, which the redirect leaves alone, and
which the lab's loss rule drops a share of), and copies bytes both ways:
what A sends waits the number of milliseconds in ``--ms-file`` (read again
when it changes, so a delay starts and stops on live connections), what comes
back passes at once — netem on A's egress, as one-way delay.  Standard
library only: it runs under the system's python3.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import struct
import time
from pathlib import Path

SO_ORIGINAL_DST = 80


class Delay:
    """The delay in ``path``, read again whenever the file changed (asked per piece of
    data: a delay set just before a connection sends applies to what it sends)."""

    def __init__(self, path: Path):
        self.path = path
        self._seconds = 0.0
        self._stamp: tuple[int, int] | None = None

    @property
    def seconds(self) -> float:
        with contextlib.suppress(OSError, ValueError):
            info = self.path.stat()
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp != self._stamp:
                self._seconds = max(0.0, float(self.path.read_text().strip() or 0) / 1000.0)
                self._stamp = stamp
        return self._seconds


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay | None
                ) -> None:
    """Copy until EOF; with ``delay``, each piece leaves that long after it arrived (in order)."""
    pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await pending.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.write_eof() if writer.can_write_eof() else writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            await pending.put((time.monotonic() + (delay.seconds if delay else 0.0), data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mark: int,
                 delay: Delay) -> None:
    sock = writer.get_extra_info("socket")
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    host = socket.inet_ntoa(packed)
    upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    upstream.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
    upstream.setblocking(False)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(upstream, (host, port)), 30)
        up_reader, up_writer = await asyncio.open_connection(sock=upstream)
    except (OSError, asyncio.TimeoutError):
        upstream.close()
        writer.close()
        return
    await asyncio.gather(_pump(reader, up_writer, delay), _pump(up_reader, writer, None))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mark", type=lambda v: int(v, 0), required=True)
    parser.add_argument("--ms-file", type=Path, required=True)
    args = parser.parse_args()
    delay = Delay(args.ms_file)
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, args.mark, delay), host="0.0.0.0", port=args.port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
