"""Serving the status page to a browser and reading what headless Chromium made of it.

:func:`served` puts an in-process page (a SimulatedNode's) on 127.0.0.1, as `gpuload serve`
would. The rest reads the page: its cards, its summary and its screenshot's pixels. The PNG reader
is a small pure-Python one (zlib and the five PNG row filters): enough for the 8-bit RGB(A)
screenshots Chromium writes, without an imaging library in the test environment.
"""

from __future__ import annotations

import re
import struct
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {2: 3, 6: 4}  # PNG colour type -> bytes per pixel at 8 bits: RGB, RGBA


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request, as the daemon answers several browsers at once."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: every request of a test would be a line."""


@contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve the WSGI ``app`` on 127.0.0.1 while the block runs; yield its URL."""
    server = make_server(
        "127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class Card:
    """One GPU card of the rendered page."""

    gpu: int
    severity: str
    verdict: str
    html: str


def cards(dom: str) -> list[Card]:
    """The GPU cards in the order the page shows them."""
    found = []
    for part in dom.split("<article ")[1:]:
        body = "<article " + part.split("</article>")[0]
        attributes = dict(re.findall(r'data-([a-z]+)="([^"]*)"', body.split(">")[0]))
        found.append(
            Card(int(attributes["gpu"]), attributes["severity"], attributes["verdict"], body)
        )
    return found


def summary(dom: str) -> dict[str, int]:
    """The counts of the node summary (``data-gpus``, ``data-lost``, ``data-firing``, ...)."""
    match = re.search(r'<ul class="summary" id="summary"([^>]*)>', dom)
    assert match, "no node summary"
    return {key: int(value) for key, value in re.findall(r'data-(\w+)="(\d+)"', match.group(1))}


def title(dom: str) -> str:
    match = re.search(r"<title>([^<]*)</title>", dom)
    assert match, "no <title>"
    return match.group(1)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(kind: int, row: bytearray, previous: bytes, bpp: int) -> bytearray:
    if kind == 1:
        for i in range(bpp, len(row)):
            row[i] = (row[i] + row[i - bpp]) & 0xFF
    elif kind == 2:
        row = bytearray((x + up) & 0xFF for x, up in zip(row, previous, strict=True))
    elif kind == 3:
        for i in range(len(row)):
            left = row[i - bpp] if i >= bpp else 0
            row[i] = (row[i] + ((left + previous[i]) >> 1)) & 0xFF
    elif kind == 4:
        for i in range(len(row)):
            left = row[i - bpp] if i >= bpp else 0
            corner = previous[i - bpp] if i >= bpp else 0
            row[i] = (row[i] + _paeth(left, previous[i], corner)) & 0xFF
    return row


def png_pixels(path: Path) -> tuple[int, int, Counter[bytes]]:
    """Width, height and how many pixels have each RGB colour."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    position, idat = 8, b""
    width = height = bpp = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        chunk = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _c, _f, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and colour in _CHANNELS and not interlace, "unexpected PNG format"
            bpp = _CHANNELS[colour]
        elif kind == b"IDAT":
            idat += chunk
    raw = zlib.decompress(idat)
    stride = width * bpp
    colours: Counter[bytes] = Counter()
    previous = bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, bpp)
        colours.update(bytes(row[x : x + 3]) for x in range(0, stride, bpp))
        previous = bytes(row)
    return width, height, colours


def rgb(hex_colour: str) -> bytes:
    """``#c53030`` as the three bytes of a pixel."""
    return bytes.fromhex(hex_colour.lstrip("#"))
