"""Media output (PNG, JPEG, WebP; MP4 with audio in `dif.media.mp4`, imported on use: it needs PyAV): pixels
in, files with metadata out, atomically."""

from dif.media.image_file import IMAGE_FORMATS, image_format, read_image_metadata, write_image
from dif.media.png import encode_png, format_parameters, read_png_metadata, to_uint8, write_png

__all__ = [
    "IMAGE_FORMATS",
    "encode_png",
    "format_parameters",
    "image_format",
    "read_image_metadata",
    "read_png_metadata",
    "to_uint8",
    "write_image",
    "write_png",
]
