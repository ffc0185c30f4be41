"""The numpy references agree with torch's functional ops where torch has the same op (oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from dif.ops.registry import get_op

torch = pytest.importorskip("torch", reason="oracle tests need torch (pip install torch==2.13.0)")
F = torch.nn.functional
pytestmark = pytest.mark.oracle

rng = np.random.default_rng(7)


def ref(name: str, *xs: np.ndarray, **attrs: object) -> np.ndarray:
    return get_op(name).run_reference(list(xs), attrs)[0]


def close(a: np.ndarray, b: torch.Tensor, tol: float = 2e-6) -> None:
    b_np = b.detach().numpy()
    err = np.linalg.norm(a - b_np) / max(np.linalg.norm(b_np), 1e-30)
    assert err <= tol, f"rel-L2 {err:.2e} > {tol}"


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_sdpa_gqa_keymask_causal() -> None:
    q, k, v = randn(2, 7, 8, 16), randn(2, 7, 2, 16), randn(2, 7, 2, 16)
    mask = np.ones((2, 7), bool)
    mask[1, 5:] = False
    for causal in (False, True):
        got = ref("sdpa", q, k, v, mask, causal=causal)
        tq, tk, tv = (t(a).transpose(1, 2) for a in (q, k, v))
        tk, tv = tk.repeat_interleave(4, dim=1), tv.repeat_interleave(4, dim=1)
        m = t(mask)[:, None, None, :]
        if causal:
            m = m & torch.ones(7, 7, dtype=torch.bool).tril()
        want = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=m).transpose(1, 2)
        close(got, want)


def test_rope_half_and_pairs() -> None:
    x = randn(1, 5, 2, 8)
    ang = rng.uniform(-3, 3, (5, 4))
    cos_h = np.concatenate([np.cos(ang)] * 2, 1).astype(np.float32)
    sin_h = np.concatenate([np.sin(ang)] * 2, 1).astype(np.float32)
    x1, x2 = t(x)[..., :4], t(x)[..., 4:]
    want = t(x) * t(cos_h)[None, :, None] + torch.cat([-x2, x1], -1) * t(sin_h)[None, :, None]
    close(ref("rope", x, cos_h, sin_h, mode="half"), want)
    # pairs: rotate complex pairs (x0 + i x1) by the angle
    xc = torch.view_as_complex(t(x).reshape(1, 5, 2, 4, 2))
    rot = torch.polar(torch.ones(5, 4, dtype=torch.float32), t(ang.astype(np.float32)))[None, :, None]
    want = torch.view_as_real(xc * rot).reshape(1, 5, 2, 8)
    cos_p, sin_p = np.repeat(np.cos(ang), 2, 1).astype(np.float32), np.repeat(np.sin(ang), 2, 1).astype(np.float32)
    close(ref("rope", x, cos_p, sin_p, mode="pairs"), want, 1e-6)


def test_conv2d_variants() -> None:
    x, w, b = randn(2, 4, 9, 8), randn(6, 2, 3, 3), randn(6)
    got = ref("conv2d", x, w, b, stride=(2, 1), padding=(1, 1, 2, 2), dilation=(1, 2), groups=2)
    close(got, F.conv2d(t(x), t(w), t(b), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2))
    w2 = randn(3, 4, 3, 3)
    close(
        ref("conv2d", x, w2, stride=(2, 2), padding=(0, 1, 0, 1)),
        F.conv2d(F.pad(t(x), (0, 1, 0, 1)), t(w2), stride=2),
    )


def test_norms() -> None:
    x, w, b = randn(2, 8, 5, 3), randn(8), randn(8)
    close(ref("group_norm", x, w, b, groups=4, eps=1e-6), F.group_norm(t(x), 4, t(w), t(b), eps=1e-6))
    y = randn(3, 5, 32)
    g, bb = randn(32), randn(32)
    close(ref("layer_norm", y, g, bb, eps=1e-6), F.layer_norm(t(y), (32,), t(g), t(bb), eps=1e-6))
    close(ref("layer_norm", y, eps=1e-6), F.layer_norm(t(y), (32,), eps=1e-6))
    close(ref("rms_norm", y, g, eps=1e-6), F.rms_norm(t(y), (32,), t(g), eps=1e-6))
    close(ref("l2_normalize", x, axis=1, eps=1e-12), F.normalize(t(x), dim=1, eps=1e-12))
    close(ref("softmax", y, axis=-1), torch.softmax(t(y), -1))


def test_activations() -> None:
    x = randn(4, 33) * 3
    close(ref("gelu", x), F.gelu(t(x)))
    close(ref("gelu", x, approximate="tanh"), F.gelu(t(x), approximate="tanh"))
    close(ref("silu", x), F.silu(t(x)))
    close(ref("sigmoid", x), torch.sigmoid(t(x)))
    y = randn(3, 16)
    a, c = t(y).chunk(2, -1)
    close(ref("glu", y, act="silu", gated_half="first"), F.silu(a) * c)
    close(ref("glu", y, act="gelu", gated_half="second"), a * F.gelu(c))


def test_linear_and_upsample() -> None:
    x, w, b = randn(2, 3, 16), randn(8, 16), randn(8)
    close(ref("linear", x, w, b), F.linear(t(x), t(w), t(b)))
    img = randn(1, 2, 3, 4)
    close(ref("upsample_nearest", img, scale=2), F.interpolate(t(img), scale_factor=2, mode="nearest"), 0)
