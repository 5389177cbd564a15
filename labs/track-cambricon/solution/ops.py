"""The operator list of the port: the aten ops of the model's exported graph, and what the vendor documents
about each on the MLU (to be verified on a device: nothing here was run on one)."""
from __future__ import annotations

import collections

import torch

from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch
from reference import CONFIG

# from the Cambricon PyTorch (torch_mlu) operator support list and the MLU-OPS docs; read, not run
MLU_STATUS = {
    "aten._assert_tensor_metadata.default": ("not a kernel", "an export-time shape/dtype assertion; no device work"),
    "aten.add.Tensor": ("supported", "torch_mlu operator list: add"),
    "aten.arange.start": ("supported", "torch_mlu operator list: arange"),
    "aten.embedding.default": ("supported", "torch_mlu operator list: embedding (index_select underneath)"),
    "aten.gelu.default": ("supported", "torch_mlu operator list: gelu; MLU-OPS has no separate tanh variant"),
    "aten.linear.default": ("supported", "composite: decomposes to matmul/addmm, which run on the MLU's matrix units"),
    "aten.mean.dim": ("supported", "torch_mlu operator list: mean"),
    "aten.mul.Tensor": ("supported", "torch_mlu operator list: mul"),
    "aten.pow.Tensor_Scalar": ("supported", "torch_mlu operator list: pow"),
    "aten.repeat_interleave.self_int": ("partial", "composite; index-based path, check the output size argument"),
    "aten.reshape.default": ("supported", "composite: a view, or a copy when strides forbid"),
    "aten.rsqrt.default": ("supported", "torch_mlu operator list: rsqrt"),
    "aten.scaled_dot_product_attention.default": ("partial", "fused flash kernel only for some dtypes/head dims; "
                                                  "else the math decomposition"),
    "aten.split.Tensor": ("supported", "a view op"),
    "aten.split_with_sizes.default": ("supported", "a view op"),
    "aten.to.dtype": ("supported", "cast kernel"),
    "aten.transpose.int": ("supported", "a view op"),
    "aten.view.default": ("supported", "a view op"),
}


def traced_ops(config: dict, batch: int) -> dict[str, int]:
    """{aten overload: count} over the call_function nodes of torch.export.export(model, (ids,))'s graph."""
    cfg = GPTConfig(**{**CONFIG, **config})
    model = GPT(cfg, seed=0).eval()
    ids, _ = synthetic_batch(cfg, batch, seed=0)
    graph = torch.export.export(model, (ids,)).graph
    return dict(collections.Counter(str(node.target) for node in graph.nodes
                                    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)))


def compatibility_list(config: dict, batch: int) -> list[dict]:
    return [{"op": op, "count": count, "mlu_status": MLU_STATUS.get(op, ("unknown", ""))[0],
             "source": MLU_STATUS.get(op, ("", "not looked up yet"))[1]}
            for op, count in sorted(traced_ops(config, batch).items())]
