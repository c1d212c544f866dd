"""sinebert's linear layer: `nn.Linear`, whose bf16 products on a CPU without a gradient (serving a model loaded with
`dtype=torch.bfloat16`) run oneDNN's linear with the bias fused into the product.

`F.linear` there runs `addmm`, which first writes the bias over every row of the output and then adds the product
into it: for the feed-forward network's first product of a batch of SST-2 dev sentences (960 x 256 by 1,024, bf16)
483 us against oneDNN's 358, for the masked-LM decoder over 608 rows (by 16,000) 3,463 against 2,555, with the same
result bit for bit (docs/SPEED.md). In float32 the two run level, and a gradient needs autograd's `F.linear`.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .attention_sinebert import is_tracing

ONEDNN = torch.backends.mkldnn.is_available()


def fused_bias_linear_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `SineBertLinear` runs oneDNN's linear on `x`: bf16 input and weight on a CPU, no gradient taken,
    a contiguous input, and neither an exporter nor `torch.compile` tracing (their graphs keep `F.linear`)."""
    return (
        ONEDNN and x.device.type == "cpu" and x.dtype == weight.dtype == torch.bfloat16 and x.is_contiguous()
        and not torch.is_grad_enabled() and not is_tracing() and not torch.compiler.is_compiling()
    )


class SineBertLinear(nn.Linear):
    """`nn.Linear` (same parameters, same results) with the bf16 serving path of `fused_bias_linear_runs`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_bias_linear_runs(x, self.weight):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
