"""The backbone's elementwise math with its gradients written out: RMSNorm and the rotary
embedding. Each is a few passes over the activations where autograd through the plain formula
takes several more (on a CPU, where nothing fuses them, bench/profile_step.py measured RMSNorm
and RoPE at about 12% of the demo-d256 fp32 step). tests/test_model.py checks both against
finite differences and against autograd of the plain formula in float64."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension, normalised in float32 even
    under bf16 autocast (a bf16 mean of squares loses precision).

    On a GPU this is ``F.rms_norm``, one fused kernel. On a CPU that call is a composite that
    autograd turns into about fourteen passes over the activations forward and backward, so
    training there goes through ``RMSNormFunction``: three passes forward, six backward
    (``bench/profile_step.py``: RMSNorm was 7% of the demo-d256 fp32 step)."""
    if x.device.type == "cpu" and torch.is_grad_enabled():
        if x.requires_grad or weight.requires_grad:
            return RMSNormFunction.apply(x, weight, eps)
    if x.dtype == weight.dtype == torch.float32:  # one call: a decode step is dispatch-bound
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * normed.to(x.dtype)


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _rms_normalised(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / rms(x), 1 / rms(x)) in float32 or wider; rms(x) = sqrt(mean(x^2) + eps) per row."""
    x = x.to(at_least_float32(x.dtype))
    mean_square = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1])
    inverse_rms = mean_square.add_(eps).rsqrt_()
    return x * inverse_rms, inverse_rms


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm with its gradient written out. With n = x * r (r = 1 / rms(x)) and y = w * n:
    dL/dw = sum over rows of g * n, and dL/dx = r * (g * w - n * mean(g * w * n)), where
    mean(g * w * n) over a row is (g * n) . w / dim, so one product g * n serves both."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        normed, inverse_rms = _rms_normalised(x, eps)
        ctx.save_for_backward(normed, weight, inverse_rms)
        ctx.input_dtype = x.dtype
        return normed.to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        normed, weight, inverse_rms = ctx.saved_tensors
        dim = normed.shape[-1]
        grad, weight_wide = grad.to(normed.dtype), weight.to(normed.dtype)
        with torch.autocast(grad.device.type, enabled=False):  # a backward inside autocast
            grad_times_normed = grad * normed
            grad_weight = None
            if ctx.needs_input_grad[1]:
                grad_weight = grad_times_normed.reshape(-1, dim).sum(0).to(weight.dtype)
            row_mean = (grad_times_normed @ weight_wide).unsqueeze(-1).div_(-dim)
            grad_x = (grad * weight_wide).addcmul_(normed, row_mean).mul_(inverse_rms)
        return grad_x.to(ctx.input_dtype), grad_weight, None


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, direction: float):
    """Pairs (a, b) = (x[i], x[i + h]) become (a cos - b sin, a sin + b cos) for direction 1
    (the inverse rotation for -1), written into one output without the concatenated
    rotate-half copy: three passes over x instead of five."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    sin_half = sin[..., :half]  # the rotate-half tables repeat each angle in both halves
    out = x * cos
    out[..., :half].addcmul_(second, sin_half, value=-direction)
    out[..., half:].addcmul_(first, sin_half, value=direction)
    return out


class RotaryFunction(torch.autograd.Function):
    """RoPE with its gradient written out: the rotation is orthogonal, so the gradient of the
    input is the output gradient rotated back by the same angles."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return rotate_pairs(x, cos, sin, direction=1.0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return rotate_pairs(grad, cos, sin, direction=-1.0), None, None
