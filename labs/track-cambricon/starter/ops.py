"""The operator list of the port: the aten ops of the model's exported graph, and what the vendor documents
about each on the MLU (to be verified on a device)."""
from __future__ import annotations

import torch

from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch
from reference import CONFIG

# op -> (status, source): supported / partial / unsupported / not a kernel / unknown, from the vendor's docs
MLU_STATUS: dict[str, tuple[str, str]] = {
    # TODO: one entry per op of your traced list
}


def traced_ops(config: dict, batch: int) -> dict[str, int]:
    """{aten overload: count} over the call_function nodes of torch.export.export(model, (ids,))'s graph."""
    # TODO: export GPT(GPTConfig(**{**CONFIG, **config}), seed=0).eval() on synthetic_batch(cfg, batch, seed=0)[0]
    raise NotImplementedError("write ops.traced_ops: count the aten overloads of the exported graph "
                              "(README: 'ops.py')")


def compatibility_list(config: dict, batch: int) -> list[dict]:
    return [{"op": op, "count": count, "mlu_status": MLU_STATUS.get(op, ("unknown", ""))[0],
             "source": MLU_STATUS.get(op, ("", "not looked up yet"))[1]}
            for op, count in sorted(traced_ops(config, batch).items())]
