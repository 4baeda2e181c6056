"""The NumPy image codecs of the example pipelines, checked against Pillow where it is installed."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pipelines.imaging import (
    ImageError,
    decode_image,
    decode_png,
    decode_pnm,
    encode_png,
    encode_pnm,
    resize,
)

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("filter_type", [0, 1, 2, 3, 4])
def test_png_round_trip_for_every_filter_and_colour_type(channels, filter_type):
    image = RNG.integers(0, 256, (7, 9, channels), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(image, filter_type)), image)


def test_png_rows_with_mixed_filters_each_read_the_row_above_as_decoded():
    image = RNG.integers(0, 256, (7, 9, 3), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(image, [2, 0, 2, 1, 0, 4, 3])), image)


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA"])
@pytest.mark.parametrize("optimize", [False, True])
def test_pngs_written_by_pillow_decode_to_the_same_pixels(mode, optimize):
    image_module = pytest.importorskip("PIL.Image", reason="Pillow is the reference encoder")
    channels = len(mode)
    pixels = RNG.integers(0, 256, (13, 17, channels), dtype=np.uint8)
    picture = image_module.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=optimize)  # optimize picks adaptive filters
    assert np.array_equal(decode_png(buffer.getvalue()), pixels)
    if channels == 3:
        assert np.array_equal(decode_image(buffer.getvalue()), pixels)


def test_ppm_and_pgm_round_trip_and_become_rgb():
    rgb = RNG.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    gray = rgb[:, :, 0]
    assert np.array_equal(decode_pnm(encode_pnm(rgb)), rgb)
    assert np.array_equal(decode_image(encode_pnm(gray)), np.repeat(gray[:, :, None], 3, 2))
    commented = b"P5\n# a comment\n2 1\n255\n\x01\x02"
    assert decode_pnm(commented).tolist() == [[[1], [2]]]


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"GIF89a", "not a PNG or binary PPM/PGM"),
     (encode_png(np.zeros((2, 2), np.uint8))[:20], "without IHDR|truncated")],
)
def test_undecodable_bytes_are_refused(data, message):
    with pytest.raises(ImageError, match=message):
        decode_image(data)


def test_resize_keeps_constant_images_and_matches_pixel_centres():
    constant = np.full((10, 20, 3), 7, np.uint8)
    assert np.allclose(resize(constant, 4, 5), 7)
    ramp = np.arange(4, dtype=np.float32)[None, :].repeat(2, 0)
    np.testing.assert_allclose(resize(ramp, 2, 2), [[0.5, 2.5], [0.5, 2.5]])
    assert resize(np.zeros((3, 3), np.uint8), 6, 9).shape == (6, 9)


def test_a_batch_of_images_resizes_as_each_image_alone():
    rng = np.random.default_rng(3)
    batch = rng.integers(0, 256, (3, 11, 7, 3), dtype=np.uint8)
    together = resize(batch, 5, 9)
    assert together.shape == (3, 5, 9, 3)
    for image, resized in zip(batch, together, strict=True):
        np.testing.assert_array_equal(resized, resize(image, 5, 9))
