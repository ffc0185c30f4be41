"""MiniMax-H3 VAE weights: a diffusers `vae/` or `audio_vae/` folder bound to the VAE programs.

Frontend stage 1 for the two autoencoders. The video VAE's tensors are used under their own names
(decoder programs ignore `encoder.*` / `quant_conv.*`, the encoder program ignores the decoder half);
the audio VAE's weight-norm pairs are folded into plain weights (`dif.weights.weight_norm`) and its
encoder half (`encoder.*`, `pre_block.*`, `mean_proj.*`, `logs_proj.*`) is ignored by the decoder.
Every missing, mis-shaped or unexpected tensor of the part a program uses is one `WeightError` naming
the tensor and the file (`dif.weights.bind_weights`).
"""

from __future__ import annotations

from pathlib import Path

from dif.errors import CheckpointError
from dif.ir.program import Program
from dif.weights import BoundWeights, TensorSource, bind_weights, open_component
from dif.weights.weight_norm import WeightNormSource

VIDEO_ENCODER_PART = (r"encoder\..*", r"quant_conv\..*")
VIDEO_DECODER_PART = (r"decoder\..*", r"post_quant_conv\..*")
AUDIO_ENCODER_PART = (r"encoder\..*", r"pre_block\..*", r"mean_proj\..*", r"logs_proj\..*")


def open_vae_folder(folder: str | Path, what: str) -> TensorSource:
    """The safetensors of one VAE component folder; `CheckpointError` naming the folder and `what`
    ("video VAE" / "audio VAE") when it is missing or holds no weights."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder}: the MiniMax-H3 {what} folder does not exist",
            hint="a MiniMax-H3 checkpoint has vae/ and audio_vae/ beside transformer/",
        )
    return open_component(folder)


def bind_video_vae(program: Program, source: TensorSource) -> BoundWeights:
    """A video VAE program's weights from the folder's tensors (the other half of the VAE ignored)."""
    ignore = VIDEO_DECODER_PART if program.meta.get("outputs") == "moments" else VIDEO_ENCODER_PART
    return bind_weights(program, source, ignore=ignore)


def bind_audio_vae(program: Program, source: TensorSource) -> BoundWeights:
    """The audio VAE decoder program's weights, weight-norm pairs folded (pass the raw folder source,
    or one already wrapped in `WeightNormSource`)."""
    folded = source if isinstance(source, WeightNormSource) else WeightNormSource(source)
    return bind_weights(program, folded, ignore=AUDIO_ENCODER_PART)


def load_video_vae(folder: str | Path, program: Program) -> BoundWeights:
    return bind_video_vae(program, open_vae_folder(folder, "video VAE"))


def load_audio_vae(folder: str | Path, program: Program) -> BoundWeights:
    return bind_audio_vae(program, open_vae_folder(folder, "audio VAE"))
