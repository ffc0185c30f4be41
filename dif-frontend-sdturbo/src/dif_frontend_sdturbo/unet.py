"""UNet2DConditionModel (SD 1.x / 2.x, SD-Turbo) as one DiffIR program: one denoiser evaluation.

Frontend stage "denoise". Inputs: `sample` (B, 4, h, w) (already scaled by 1/sqrt(sigma^2+1)),
`timestep_proj` (B, C0) the host-side sinusoid of the timestep (`timestep_features`), `text`
(B, L, cross_dim). Structure (diffusers' module tree, which names the weights):
  temb = time_embedding.linear_2(silu(time_embedding.linear_1(timestep_proj)))
  conv_in -> down_blocks[i]: layers_per_block x (resnet [, Transformer2D]) [+ downsampler conv s2]
  -> mid_block: resnet, Transformer2D, resnet
  -> up_blocks[i]: (layers_per_block+1) x (concat skip, resnet [, Transformer2D]) [+ nearest 2x, conv]
  -> conv_norm_out, silu, conv_out
Resnet: GN-silu-conv1, + time_emb_proj(silu(temb)), GN-silu-conv2, + (1x1 conv_shortcut) input.
Transformer2D: GN(eps 1e-6) -> proj_in (linear, or 1x1 conv for SD 1.x) -> blocks of
[LN, self-attn; LN, cross-attn on `text`; LN, GEGLU FF (value half * gelu(gate half))] -> proj_out -> + input.
Heads per block come from the config (`UNetConfig.heads`), each of C / heads channels.
"""

from __future__ import annotations

import numpy as np

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers import activation, conv2d, group_norm, layer_norm, linear, project_heads, sinusoidal_embedding
from dif.layers.conv_blocks import norm_act_conv
from dif_frontend_sdturbo.config import UNetConfig

MODULE = "unet"
TRANSFORMER_GN_EPS = 1e-6  # Transformer2DModel's GroupNorm (diffusers hard-codes it)
LAYER_NORM_EPS = 1e-5  # BasicTransformerBlock's LayerNorms


def timestep_features(cfg: UNetConfig, timesteps: np.ndarray | list[float]) -> np.ndarray:
    """(B,) timesteps -> (B, block_out_channels[0]) float32: diffusers' `Timesteps` projection
    ([cos | sin] with flip_sin_to_cos), cast to the run dtype by the caller."""
    return sinusoidal_embedding(
        np.asarray(timesteps, np.float32),
        cfg.block_out_channels[0],
        flip_sin_to_cos=cfg.flip_sin_to_cos,
        downscale_freq_shift=cfg.freq_shift,
    )


def resnet(b: ProgramBuilder, x: Var, temb: Var, name: str, out: int, cfg: UNetConfig) -> Var:
    """ResnetBlock2D with a time embedding: x [B, C, H, W], temb [B, T] (already silu'd) -> [B, out, H, W]."""
    g, eps = cfg.norm_num_groups, cfg.norm_eps
    h = norm_act_conv(b, x, f"{name}.norm1", f"{name}.conv1", out, groups=g, eps=eps)
    t = linear(b, temb, f"{name}.time_emb_proj", out, bias=True)
    h = b.emit("add", h, b.emit("reshape", t, shape=(t.shape[0], out, 1, 1)))
    h = norm_act_conv(b, h, f"{name}.norm2", f"{name}.conv2", out, groups=g, eps=eps)
    skip = x if x.shape[1] == out else conv2d(b, x, f"{name}.conv_shortcut", out, 1)
    return b.emit("add", skip, h)


def _attention(b: ProgramBuilder, x: Var, ctx: Var, name: str, heads: int) -> Var:
    """diffusers `Attention` (no q/k/v bias, biased to_out.0): x [B, S, C], ctx [B, L, Cc] -> [B, S, C]."""
    c = x.shape[-1]
    hd = c // heads
    q = project_heads(b, x, f"{name}.to_q", heads, hd)
    k = project_heads(b, ctx, f"{name}.to_k", heads, hd)
    v = project_heads(b, ctx, f"{name}.to_v", heads, hd)
    o = b.emit("sdpa", q, k, v, None, scale=0.0, causal=False)
    o = b.emit("reshape", o, shape=(x.shape[0], x.shape[1], c))
    return linear(b, o, f"{name}.to_out.0", c, bias=True)


def _transformer_block(b: ProgramBuilder, x: Var, text: Var, name: str, heads: int) -> Var:
    c = x.shape[-1]
    h = layer_norm(b, x, f"{name}.norm1", eps=LAYER_NORM_EPS)
    x = b.emit("add", x, _attention(b, h, h, f"{name}.attn1", heads))
    h = layer_norm(b, x, f"{name}.norm2", eps=LAYER_NORM_EPS)
    x = b.emit("add", x, _attention(b, h, text, f"{name}.attn2", heads))
    h = layer_norm(b, x, f"{name}.norm3", eps=LAYER_NORM_EPS)
    h = linear(b, h, f"{name}.ff.net.0.proj", 8 * c, bias=True)
    h = b.emit("glu", h, act="gelu", gated_half="second")  # GEGLU: value * gelu(gate)
    return b.emit("add", x, linear(b, h, f"{name}.ff.net.2", c, bias=True))


def transformer_2d(b: ProgramBuilder, x: Var, text: Var, name: str, heads: int, depth: int, cfg: UNetConfig) -> Var:
    """Transformer2DModel over x [B, C, H, W] attending to text [B, L, Cc] -> [B, C, H, W]."""
    n, c, hh, ww = x.shape
    h = group_norm(b, x, f"{name}.norm", groups=cfg.norm_num_groups, eps=TRANSFORMER_GN_EPS)
    if not cfg.use_linear_projection:
        h = conv2d(b, h, f"{name}.proj_in", c, 1)
    h = b.emit("transpose", b.emit("reshape", h, shape=(n, c, hh * ww)), perm=(0, 2, 1))
    if cfg.use_linear_projection:
        h = linear(b, h, f"{name}.proj_in", c, bias=True)
    for i in range(depth):
        h = _transformer_block(b, h, text, f"{name}.transformer_blocks.{i}", heads)
    if cfg.use_linear_projection:
        h = linear(b, h, f"{name}.proj_out", c, bias=True)
    h = b.emit("reshape", b.emit("transpose", h, perm=(0, 2, 1)), shape=(n, c, hh, ww))
    if not cfg.use_linear_projection:
        h = conv2d(b, h, f"{name}.proj_out", c, 1)
    return b.emit("add", h, x)


def check_latent_size(cfg: UNetConfig, latent_h: int, latent_w: int) -> None:
    from dif.errors import UsageError

    f = cfg.downsample_factor
    if latent_h <= 0 or latent_w <= 0 or latent_h % f or latent_w % f:
        raise UsageError(f"UNet latent size {latent_h}x{latent_w} must be a positive multiple of {f}")


def build_unet(
    cfg: UNetConfig, *, latent_h: int, latent_w: int, text_len: int = 77, batch: int = 1, dtype: DType | str = "f32"
) -> Program:
    """UNet2DConditionModel.forward as one program; output `noise_pred` (B, out_channels, h, w)."""
    check_latent_size(cfg, latent_h, latent_w)
    dt = DType(dtype)
    chans = cfg.block_out_channels
    b = ProgramBuilder("sd_unet")
    b.meta.update({"family": "sdturbo", "component": "unet", "dtype": dt.value, "outputs": "noise_pred"})
    x = b.input("sample", (batch, cfg.in_channels, latent_h, latent_w), dt)
    proj = b.input("timestep_proj", (batch, chans[0]), dt)
    text = b.input("text", (batch, text_len, cfg.cross_attention_dim), dt)
    with b.scope(module=MODULE, block="time_embedding", section="mlp"):
        temb = linear(b, proj, "time_embedding.linear_1", cfg.time_embed_dim, bias=True)
        temb = linear(b, b.emit("silu", temb), "time_embedding.linear_2", cfg.time_embed_dim, bias=True)
        temb = b.emit("silu", temb)  # every resnet's time_emb_proj reads silu(temb)
    with b.scope(module=MODULE, block="conv_in", section="conv"):
        x = conv2d(b, x, "conv_in", chans[0], 3, padding=1)
    skips = [x]
    for i, out in enumerate(chans):
        name = f"down_blocks.{i}"
        for j in range(cfg.layers_per_block):
            with b.scope(module=MODULE, block=name, section=f"resnets.{j}"):
                x = resnet(b, x, temb, f"{name}.resnets.{j}", out, cfg)
            if cfg.down_cross[i]:
                with b.scope(module=MODULE, block=name, section=f"attentions.{j}"):
                    x = transformer_2d(
                        b, x, text, f"{name}.attentions.{j}", cfg.heads[i], cfg.transformer_layers[i], cfg
                    )
            skips.append(x)
        if i < len(chans) - 1:
            with b.scope(module=MODULE, block=name, section="downsample"):
                x = conv2d(b, x, f"{name}.downsamplers.0.conv", out, 3, stride=2, padding=1)
            skips.append(x)
    with b.scope(module=MODULE, block="mid_block", section="resnets.0"):
        x = resnet(b, x, temb, "mid_block.resnets.0", chans[-1], cfg)
    with b.scope(module=MODULE, block="mid_block", section="attentions.0"):
        x = transformer_2d(b, x, text, "mid_block.attentions.0", cfg.heads[-1], cfg.transformer_layers[-1], cfg)
    with b.scope(module=MODULE, block="mid_block", section="resnets.1"):
        x = resnet(b, x, temb, "mid_block.resnets.1", chans[-1], cfg)
    rev = list(reversed(chans))
    rev_heads, rev_depth = list(reversed(cfg.heads)), list(reversed(cfg.transformer_layers))
    for i, out in enumerate(rev):
        name = f"up_blocks.{i}"
        for j in range(cfg.layers_per_block + 1):
            with b.scope(module=MODULE, block=name, section=f"resnets.{j}"):
                x = b.emit("concat", x, skips.pop(), axis=1)
                x = resnet(b, x, temb, f"{name}.resnets.{j}", out, cfg)
            if cfg.up_cross[i]:
                with b.scope(module=MODULE, block=name, section=f"attentions.{j}"):
                    x = transformer_2d(b, x, text, f"{name}.attentions.{j}", rev_heads[i], rev_depth[i], cfg)
        if i < len(rev) - 1:
            with b.scope(module=MODULE, block=name, section="upsample"):
                x = b.emit("upsample_nearest", x, scale=2)
                x = conv2d(b, x, f"{name}.upsamplers.0.conv", out, 3, padding=1)
    with b.scope(module=MODULE, block="conv_out", section="out"):
        h = activation(b, group_norm(b, x, "conv_norm_out", groups=cfg.norm_num_groups, eps=cfg.norm_eps), "silu")
        b.output(conv2d(b, h, "conv_out", cfg.out_channels, 3, padding=1))
    return b.build()
