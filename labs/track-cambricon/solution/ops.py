"""The operator list of the port: the aten ops of the model's exported graph, and what the vendor documents
about each on the MLU (to be verified on a device: nothing here was run on one)."""
from __future__ import annotations

import collections

import torch

from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch
from reference import CONFIG

# read in torch_mlu's codegen/mlu_functions.yaml (the ops it registers at PrivateUse1; commit d578002, Sep 2024)
# and its tests; read, not run: every status is to be verified on an MLU
LIST = "mlu_functions.yaml"
MLU_STATUS = {
    "aten._assert_tensor_metadata.default": ("not a kernel", "an assertion torch.export inserts; no device work"),
    "aten.add.Tensor": ("supported", f"{LIST}: add.Tensor"),
    "aten.arange.start": ("supported", f"composite; {LIST}: arange.start_out"),
    "aten.embedding.default": ("supported", f"{LIST}: embedding"),
    "aten.gelu.default": ("supported", f"{LIST}: gelu"),
    "aten.linear.default": ("supported", f"composite: decomposes to mm / addmm; {LIST}: mm, addmm"),
    "aten.mean.dim": ("supported", f"{LIST}: mean.dim"),
    "aten.mul.Tensor": ("supported", f"{LIST}: mul.Tensor"),
    "aten.pow.Tensor_Scalar": ("supported", f"{LIST}: pow.Tensor_Scalar"),
    "aten.repeat_interleave.self_int": ("supported", f"composite; {LIST}: repeat_interleave.Tensor, index_select"),
    "aten.reshape.default": ("supported", f"composite: a view, or a copy; {LIST}: view, copy_"),
    "aten.rsqrt.default": ("supported", f"{LIST}: rsqrt"),
    "aten.scaled_dot_product_attention.default": (
        "partial", f"composite; {LIST}: _fused_sdp_choice, flash and efficient kernels; torch_mlu's tests expect "
        "'No viable backend' for some inputs"),
    "aten.split.Tensor": ("supported", f"a view (composite explicit); {LIST}: as_strided"),
    "aten.split_with_sizes.default": ("supported", f"a view (composite explicit); {LIST}: as_strided"),
    "aten.to.dtype": ("supported", f"composite: _to_copy; {LIST}: copy_"),
    "aten.transpose.int": ("supported", f"a view (composite explicit); {LIST}: as_strided"),
    "aten.view.default": ("supported", f"{LIST}: view"),
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
