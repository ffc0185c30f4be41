"""Media output (PNG now; MP4 with audio later): pixels in, files with metadata out, atomically."""

from dif.media.png import encode_png, format_parameters, read_png_metadata, to_uint8, write_png

__all__ = ["encode_png", "format_parameters", "read_png_metadata", "to_uint8", "write_png"]
