"""Image codecs and resizing in NumPy, for the example pipelines.

Why not Pillow: the examples' operators run inside the served pipeline model, and keeping them
to NumPy and the standard library (``zlib``) means the serving environment needs nothing more.
Supported: PNG (8-bit grayscale, RGB, RGBA, gray+alpha; non-interlaced; every filter type) and
binary PPM/PGM (P6/P5, maxval 255). Decoded images are ``uint8`` arrays ``H x W x 3`` (RGB).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np

from builder import rejects

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


class ImageError(ValueError):
    """The bytes are not an image this module can decode."""


@rejects(ImageError)
def decode_image(data: bytes) -> np.ndarray:
    """PNG or PPM/PGM bytes → ``uint8`` RGB array ``H x W x 3``; other bytes are the
    caller's mistake (served: ``INVALID_ARGUMENT``)."""
    data = bytes(data)
    if data.startswith(PNG_SIGNATURE):
        return _to_rgb(decode_png(data))
    if data[:2] in (b"P5", b"P6"):
        return _to_rgb(decode_pnm(data))
    raise ImageError("not a PNG or binary PPM/PGM image")


def decode_png(data: bytes) -> np.ndarray:
    """PNG bytes → ``uint8`` array ``H x W x C`` (C = 1, 2, 3 or 4)."""
    if not data.startswith(PNG_SIGNATURE):
        raise ImageError("not a PNG image")
    position, header, compressed = len(PNG_SIGNATURE), None, []
    while position < len(data):
        if position + 8 > len(data):
            raise ImageError("truncated PNG chunk")
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if len(body) != length:
            raise ImageError("truncated PNG chunk")
        position += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise ImageError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in _CHANNELS or interlace:
        raise ImageError(f"unsupported PNG: bit depth {depth}, colour type {colour}, "
                         f"interlace {interlace} (8-bit non-interlaced only)")
    channels = _CHANNELS[colour]
    stride = width * channels
    try:
        raw = np.frombuffer(zlib.decompress(b"".join(compressed)), dtype=np.uint8)
    except zlib.error as error:
        raise ImageError(f"corrupt PNG pixel data: {error}") from None
    if raw.size != height * (stride + 1):
        raise ImageError("PNG pixel data has the wrong size")
    rows = raw.reshape(height, stride + 1)
    image = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        image[y] = _unfilter(int(rows[y, 0]), rows[y, 1:], previous, channels)
        previous = image[y]
    return image.reshape(height, width, channels)


def encode_png(image: np.ndarray, filter_type: int | Sequence[int] = 0) -> bytes:
    """``uint8`` array ``H x W`` or ``H x W x C`` → PNG bytes, every row with ``filter_type``
    (or row ``y`` with ``filter_type[y]``)."""
    image = np.asarray(image, dtype=np.uint8)
    if image.ndim == 2:
        image = image[:, :, None]
    height, width, channels = image.shape
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    rows = image.reshape(height, width * channels).astype(np.int32)
    kinds = [filter_type] * height if isinstance(filter_type, int) else list(filter_type)
    lines = []
    for y, kind in enumerate(kinds):
        above = rows[y - 1] if y else np.zeros_like(rows[y])
        lines.append(bytes([kind]) + _filter(kind, rows[y], above, channels))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return (PNG_SIGNATURE + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"".join(lines))) + chunk(b"IEND", b""))


def decode_pnm(data: bytes) -> np.ndarray:
    """Binary PGM (P5) or PPM (P6) bytes → ``uint8`` array ``H x W x C``."""
    fields, position = [], 2
    while len(fields) < 3:
        while position < len(data) and data[position:position + 1].isspace():
            position += 1
        if data[position:position + 1] == b"#":
            position = data.index(b"\n", position) + 1
            continue
        end = position
        while end < len(data) and not data[end:end + 1].isspace():
            end += 1
        fields.append(int(data[position:end]))
        position = end
    width, height, maxval = fields
    if maxval != 255:
        raise ImageError(f"unsupported PNM maxval {maxval} (255 only)")
    channels = 3 if data[:2] == b"P6" else 1
    pixels = np.frombuffer(data[position + 1:], dtype=np.uint8)
    if pixels.size < width * height * channels:
        raise ImageError("truncated PNM pixel data")
    return pixels[: width * height * channels].reshape(height, width, channels).copy()


def encode_pnm(image: np.ndarray) -> bytes:
    """``uint8`` array → PPM (RGB) or PGM (grayscale) bytes."""
    image = np.asarray(image, dtype=np.uint8)
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    magic = b"P6" if image.ndim == 3 else b"P5"
    return magic + f"\n{image.shape[1]} {image.shape[0]}\n255\n".encode() + image.tobytes()


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize (pixel centres aligned, as OpenCV's ``INTER_LINEAR``) → ``float32``.

    ``H x W``, ``H x W x C``, or a batch of same-sized images ``N x H x W x C`` in one go.
    Rows first, then columns: four gathers and two interpolations, whatever the batch.
    """
    image = np.asarray(image, dtype=np.float32)
    squeeze = image.ndim == 2
    if squeeze:
        image = image[:, :, None]
    y0, y1, wy = _TAPS.of(image.shape[-3], height)
    x0, x1, wx = _TAPS.of(image.shape[-2], width)
    upper, lower = np.take(image, y0, axis=-3), np.take(image, y1, axis=-3)
    rows = upper + (lower - upper) * wy[:, None, None]
    left, right = np.take(rows, x0, axis=-2), np.take(rows, x1, axis=-2)
    result = left + (right - left) * wx[:, None]
    return result[:, :, 0] if squeeze else result


class _Taps(dict):
    """Interpolation taps by ``(size, count)``, computed once per image size.

    Not ``functools.lru_cache``: a cached function is pickled by reference, so ``pipe.pickle``
    would need this module installed where it is served. This cache pickles empty instead, so
    ``pipe.pickle`` is also the same whatever images ran before the build.
    """

    LIMIT = 256

    def __reduce__(self) -> tuple:
        return type(self), ()

    def of(self, size: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``count`` samples over ``size`` pixels: the two neighbours and the weight of
        the second (read-only: shared by every image of that size)."""
        taps = self.get((size, count))
        if taps is None:
            if len(self) >= self.LIMIT:
                self.clear()
            positions = np.clip((np.arange(count, dtype=np.float64) + 0.5) * size / count - 0.5,
                                0, size - 1)
            first = np.floor(positions).astype(np.intp)
            second = np.minimum(first + 1, size - 1)
            weight = (positions - first).astype(np.float32)
            for array in (first, second, weight):
                array.flags.writeable = False
            taps = self[size, count] = first, second, weight
        return taps


_TAPS = _Taps()


def _to_rgb(image: np.ndarray) -> np.ndarray:
    channels = image.shape[2]
    if channels in (1, 2):
        return np.repeat(image[:, :, :1], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def _unfilter(kind: int, line: np.ndarray, above: np.ndarray, bpp: int) -> np.ndarray:
    if kind == 0:
        return line.copy()
    if kind == 2:
        return (line.astype(np.uint16) + above).astype(np.uint8)
    if kind == 1:  # each byte adds the reconstructed byte bpp to its left: a running sum
        width = len(line) // bpp
        sums = np.cumsum(line.reshape(width, bpp).astype(np.uint32), axis=0)
        return (sums % 256).astype(np.uint8).reshape(-1)
    if kind not in (3, 4):
        raise ImageError(f"unknown PNG filter type {kind}")
    out = bytearray(len(line))
    raw, up = line.tolist(), above.tolist()
    for i in range(len(raw)):
        left = out[i - bpp] if i >= bpp else 0
        if kind == 3:
            predictor = (left + up[i]) // 2
        else:
            upper_left = up[i - bpp] if i >= bpp else 0
            predictor = _paeth(left, up[i], upper_left)
        out[i] = (raw[i] + predictor) & 0xFF
    return np.frombuffer(bytes(out), dtype=np.uint8)


def _filter(kind: int, row: np.ndarray, above: np.ndarray, bpp: int) -> bytes:
    left = np.concatenate([np.zeros(bpp, dtype=np.int32), row[:-bpp]])
    upper_left = np.concatenate([np.zeros(bpp, dtype=np.int32), above[:-bpp]])
    if kind == 0:
        predictor = np.zeros_like(row)
    elif kind == 1:
        predictor = left
    elif kind == 2:
        predictor = above
    elif kind == 3:
        predictor = (left + above) // 2
    elif kind == 4:
        predictor = np.array([_paeth(a, b, c) for a, b, c in
                              zip(left.tolist(), above.tolist(), upper_left.tolist(),
                                  strict=True)], dtype=np.int32)
    else:
        raise ImageError(f"unknown PNG filter type {kind}")
    return ((row - predictor) % 256).astype(np.uint8).tobytes()


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c
