"""A PNG's pixels without an imaging library (zlib and the five PNG filters), to check
that a screenshot shows something: a blank page is one colour, or a handful."""

from __future__ import annotations

import struct
import zlib

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # greyscale, RGB, grey+alpha, RGBA


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def rows(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, the unfiltered rows) of an 8-bit, non-interlaced PNG."""
    assert png.startswith(_SIGNATURE), "not a PNG"
    at, data, header = len(_SIGNATURE), bytearray(), b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        at += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            data += body
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in _CHANNELS and not interlace, (depth, colour, interlace)
    step = _CHANNELS[colour]
    stride = width * step
    raw = zlib.decompress(bytes(data))
    previous = bytearray(stride)
    out: list[bytes] = []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(step, stride):
                line[i] = (line[i] + line[i - step]) & 0xFF
        elif kind == 2:
            line = bytearray((x + p) & 0xFF for x, p in zip(line, previous, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = line[i - step] if i >= step else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                left = line[i - step] if i >= step else 0
                corner = previous[i - step] if i >= step else 0
                line[i] = (line[i] + _paeth(left, previous[i], corner)) & 0xFF
        out.append(bytes(line))
        previous = line
    return width, height, out


def colours(png: bytes) -> int:
    """How many distinct pixel values the image has."""
    width, _, lines = rows(png)
    step = len(lines[0]) // width if lines else 1
    seen: set[bytes] = set()
    for line in lines:
        seen.update(line[i : i + step] for i in range(0, len(line), step))
    return len(seen)
