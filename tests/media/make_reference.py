#!/usr/bin/python3
"""Reference outputs for media_reference_test, from Pillow and numpy only.

usage: make_reference.py OUT_DIR

Writes test images made with Pillow (and, where Pillow cannot write the format, a minimal PNG
writer below) into OUT_DIR/inputs/, keeping any file already there (the C++ test adds images
Pillow cannot encode, such as YCCK JPEG). Then, for every file in OUT_DIR/inputs/:

  1. decodes it the way vLLM's ImageMediaIO.load_bytes does: Image.open, then
     convert_image_mode(image, "RGB") -- RGBA pasted over white with the alpha as mask, every other
     mode through image.convert("RGB"); no ImageOps.exif_transpose (vLLM does not call it);
  2. runs transformers' Qwen2VLImageProcessor (the slow PIL path) on that RGB image, written out
     from its documented algorithm: smart_resize, PIL resize BICUBIC of the uint8 image, rescale
     (float64 multiply, cast to float32), normalize ((x - mean) / std in float32), the image
     repeated to temporal_patch_size frames, reshape / transpose(0,3,6,4,7,2,1,5,8) / reshape.

Outputs in OUT_DIR/expected/: NAME.rgb.npy (uint8 H x W x 3), NAME.pixels.npy (float32
[patches, patch_dim]) or NAME.error.txt (the ValueError smart_resize raises), and manifest.txt
with one line per input: "NAME FILE ok H W GRID_T GRID_H GRID_W" or "NAME FILE error".
"""

import io
import math
import os
import struct
import sys
import warnings
import zlib

import numpy as np
from PIL import Image

# Qwen2VLImageProcessor defaults (transformers), the config the C++ test uses too.
PATCH_SIZE = 14
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]
RESCALE_FACTOR = 1 / 255


# ----------------------------------------------------------------------------------------------
# The reference: vLLM's image loading and transformers' Qwen2VLImageProcessor.


def vllm_load_rgb(data):
    """vllm/multimodal/media/image.py ImageMediaIO.load_bytes + _convert_image_mode."""
    image = Image.open(io.BytesIO(data))
    if image.mode == "RGB":
        return image
    if image.mode == "RGBA":
        # vllm/multimodal/image.py rgba_to_rgb with the default white background.
        converted = Image.new("RGB", image.size, (255, 255, 255))
        converted.paste(image, mask=image.split()[3])
        return converted
    return image.convert("RGB")


def smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280):
    """transformers/models/qwen2_vl/image_processing_qwen2_vl.py smart_resize."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen2vl_preprocess(rgb):
    """Qwen2VLImageProcessor._preprocess for one uint8 H x W x 3 image (channels last)."""
    height, width = rgb.shape[:2]
    resized_height, resized_width = smart_resize(
        height, width, PATCH_SIZE * MERGE_SIZE, MIN_PIXELS, MAX_PIXELS)
    # image_transforms.resize: uint8 array -> PIL image -> resize((w, h), BICUBIC) -> array.
    image = np.array(Image.fromarray(rgb).resize((resized_width, resized_height),
                                                  resample=Image.BICUBIC))
    # image_transforms.rescale: upcast to float64, multiply, cast to float32.
    image = (image.astype(np.float64) * RESCALE_FACTOR).astype(np.float32)
    # image_transforms.normalize, channels last, float32 mean/std.
    mean = np.array(IMAGE_MEAN, dtype=image.dtype)
    std = np.array(IMAGE_STD, dtype=image.dtype)
    image = (image - mean) / std
    # to_channel_dimension_format(FIRST), then the patch flattening.
    image = image.transpose(2, 0, 1)
    patches = np.array([image])
    if patches.shape[0] % TEMPORAL_PATCH_SIZE != 0:
        repeats = np.repeat(patches[-1][np.newaxis], TEMPORAL_PATCH_SIZE - 1, axis=0)
        patches = np.concatenate([patches, repeats], axis=0)
    channel = patches.shape[1]
    grid_t = patches.shape[0] // TEMPORAL_PATCH_SIZE
    grid_h, grid_w = resized_height // PATCH_SIZE, resized_width // PATCH_SIZE
    patches = patches.reshape(grid_t, TEMPORAL_PATCH_SIZE, channel, grid_h // MERGE_SIZE,
                              MERGE_SIZE, PATCH_SIZE, grid_w // MERGE_SIZE, MERGE_SIZE,
                              PATCH_SIZE)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(grid_t * grid_h * grid_w,
                           channel * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE)
    return flat, (resized_height, resized_width), (grid_t, grid_h, grid_w)


# ----------------------------------------------------------------------------------------------
# Test images.


def photo_like(width, height, seed):
    """Smooth gradients, a few shapes and sensor-like noise, deterministic."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 128 + 100 * np.sin(x / (width / 5.0)) * np.cos(y / (height / 3.0))
    g = 255.0 * x / max(width - 1, 1)
    b = 255.0 * y / max(height - 1, 1)
    image = np.stack([r, g, b], axis=-1)
    cx, cy = width * 0.6, height * 0.4
    disc = (x - cx) ** 2 + (y - cy) ** 2 < (min(width, height) * 0.2) ** 2
    image[disc] = [250, 240, 30]
    image[int(height * 0.7):int(height * 0.8), int(width * 0.1):int(width * 0.5)] = [20, 30, 200]
    image += rng.normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def png_bytes(width, height, bit_depth, color_type, rows, plte=None, trns=None):
    """A minimal PNG writer for what Pillow cannot write (16-bit colour, short palettes)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    if plte is not None:
        out += chunk(b"PLTE", bytes(plte))
    if trns is not None:
        out += chunk(b"tRNS", bytes(trns))
    raw = b"".join(b"\x00" + row for row in rows)
    return out + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def pack_bits(values, bit_depth):
    out = bytearray()
    per_byte = 8 // bit_depth
    for i in range(0, len(values), per_byte):
        byte = 0
        for j in range(per_byte):
            v = values[i + j] if i + j < len(values) else 0
            byte |= v << (8 - bit_depth * (j + 1))
        out.append(byte)
    return bytes(out)


def save(image, fmt, **params):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def make_inputs():
    """name -> (file extension, bytes)."""
    rng = np.random.default_rng(1234)
    images = {}

    photo = photo_like(333, 517, 1)
    images["rgb_333x517"] = ("png", save(Image.fromarray(photo), "PNG"))
    images["photo_1280x720"] = ("jpg", save(Image.fromarray(photo_like(1280, 720, 2)), "JPEG",
                                            quality=90))
    images["photo_1600x1200"] = ("png", save(Image.fromarray(photo_like(1600, 1200, 3)), "PNG"))
    images["tiny_10x10"] = ("png", save(Image.fromarray(photo_like(10, 10, 4)), "PNG"))
    images["strip_1x5000"] = ("png", save(Image.fromarray(photo_like(1, 5000, 5)), "PNG"))
    images["strip_5000x1"] = ("png", save(Image.fromarray(photo_like(5000, 1, 6)), "PNG"))

    rgba = np.concatenate([photo_like(97, 61, 7),
                           (np.arange(97 * 61) % 256).astype(np.uint8).reshape(61, 97, 1)],
                          axis=-1)
    images["rgba_varying_alpha"] = ("png", save(Image.fromarray(rgba, "RGBA"), "PNG"))
    grey = photo_like(120, 90, 8)[:, :, 1]
    images["grey_L"] = ("png", save(Image.fromarray(grey, "L"), "PNG"))
    la = np.stack([grey, 255 - grey], axis=-1)
    images["grey_alpha_LA"] = ("png", save(Image.fromarray(la, "LA"), "PNG"))
    images["bilevel_1bit"] = ("png", save(Image.fromarray(grey > 128), "PNG"))

    palette_image = Image.fromarray(photo_like(64, 48, 9)).quantize(colors=37)
    palette_image.info["transparency"] = bytes(range(0, 256, 7))[:37]
    images["palette_trns"] = ("png", save(palette_image, "PNG",
                                          transparency=bytes(range(0, 256, 7))[:37]))
    # A 4-bit palette of 5 entries whose indices run past it (PIL's palette there: a grey ramp).
    indices = (np.arange(40 * 30) % 16).tolist()
    rows = [pack_bits(indices[y * 40:(y + 1) * 40], 4) for y in range(30)]
    images["palette_short_4bit"] = ("png", png_bytes(
        40, 30, 4, 3, rows, plte=[255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9, 200, 100, 50],
        trns=[0, 128]))
    grey2 = (np.arange(50 * 20) % 4).tolist()
    images["grey_2bit"] = ("png", png_bytes(
        50, 20, 2, 0, [pack_bits(grey2[y * 50:(y + 1) * 50], 2) for y in range(20)]))

    wide = rng.integers(0, 65536, size=(37, 53, 4), dtype=np.uint16)
    wide[:, :, 3] = np.linspace(0, 65535, 53, dtype=np.uint16)[None, :]
    images["rgb_16bit"] = ("png", png_bytes(53, 37, 16, 2, [
        wide[y, :, :3].astype(">u2").tobytes() for y in range(37)]))
    images["rgba_16bit"] = ("png", png_bytes(53, 37, 16, 6, [
        wide[y].astype(">u2").tobytes() for y in range(37)]))
    images["grey_alpha_16bit"] = ("png", png_bytes(53, 37, 16, 4, [
        wide[y, :, 2:].astype(">u2").tobytes() for y in range(37)]))
    # Small 16-bit values too, so PIL's clip of 16-bit grey at 255 shows both ways.
    grey16 = wide[:, :, 0].copy()
    grey16[:, ::2] %= 300
    images["grey_16bit"] = ("png", png_bytes(53, 37, 16, 0, [
        grey16[y].astype(">u2").tobytes() for y in range(37)]))

    photo_image = Image.fromarray(photo_like(200, 150, 10))
    images["rgb_jpeg_420"] = ("jpg", save(photo_image, "JPEG", quality=85))
    images["rgb_jpeg_444"] = ("jpg", save(photo_image, "JPEG", quality=95, subsampling=0))
    images["rgb_jpeg_progressive"] = ("jpg", save(photo_image, "JPEG", quality=80,
                                                  progressive=True))
    images["grey_jpeg"] = ("jpg", save(photo_image.convert("L"), "JPEG", quality=90))
    images["cmyk_jpeg"] = ("jpg", save(photo_image.convert("CMYK"), "JPEG", quality=90))
    for orientation in (6, 3):
        exif = Image.Exif()
        exif[0x0112] = orientation
        images[f"exif_orientation_{orientation}"] = ("jpg", save(
            Image.fromarray(photo_like(90, 60, 11)), "JPEG", quality=90, exif=exif.tobytes()))

    webp_rgba = Image.fromarray(rgba, "RGBA")
    images["webp_lossy"] = ("webp", save(photo_image, "WEBP", quality=80))
    images["webp_lossless_alpha"] = ("webp", save(webp_rgba, "WEBP", lossless=True))
    images["webp_lossy_alpha"] = ("webp", save(webp_rgba, "WEBP", quality=75))
    frames = [Image.fromarray(photo_like(64, 40, 12 + i)) for i in range(2)]
    images["webp_animated"] = ("webp", save(frames[0], "WEBP", save_all=True,
                                            append_images=frames[1:], duration=100))
    return images


def write_npy(path, array):
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    # convert("RGB") of a palette image with tRNS bytes warns; the pixels are what we want.
    warnings.filterwarnings("ignore", category=UserWarning)
    inputs_dir = os.path.join(out_dir, "inputs")
    expected_dir = os.path.join(out_dir, "expected")
    os.makedirs(inputs_dir, exist_ok=True)
    os.makedirs(expected_dir, exist_ok=True)
    for name, (ext, data) in make_inputs().items():
        with open(os.path.join(inputs_dir, f"{name}.{ext}"), "wb") as f:
            f.write(data)

    manifest = []
    for file_name in sorted(os.listdir(inputs_dir)):
        name = os.path.splitext(file_name)[0]
        with open(os.path.join(inputs_dir, file_name), "rb") as f:
            data = f.read()
        rgb = np.array(vllm_load_rgb(data))
        assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3, file_name
        write_npy(os.path.join(expected_dir, f"{name}.rgb.npy"), rgb)
        try:
            pixels, (h, w), (gt, gh, gw) = qwen2vl_preprocess(rgb)
        except ValueError as e:
            with open(os.path.join(expected_dir, f"{name}.error.txt"), "w") as f:
                f.write(str(e))
            manifest.append(f"{name} {file_name} error")
            continue
        write_npy(os.path.join(expected_dir, f"{name}.pixels.npy"), pixels.astype(np.float32))
        manifest.append(f"{name} {file_name} ok {h} {w} {gt} {gh} {gw}")
    with open(os.path.join(expected_dir, "manifest.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
