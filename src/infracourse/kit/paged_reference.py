"""Week 16 references: attention over a contiguous KV cache, the invariants of a block allocator, and the index
of a pinned vLLM release that a learner's trace of one request is checked against.

Shapes (one decode query per sequence, B sequences):
    q                 (B, n_head, head_dim)
    keys[b], values[b] (kv_heads, L_b, head_dim): sequence b's L_b cached tokens, in order
    n_head is a multiple of kv_heads: query head h reads KV head h // (n_head // kv_heads) (grouped-query).

An allocator's state, as the learner's `BlockAllocator.state()` reports it (week 16's handout):
    {"free": [block ids with no reference],          # plain free blocks and unreferenced cached ones
     "ref_counts": [one int per block],
     "block_tables": {seq_id: [block ids, in token order]}}
"""
from __future__ import annotations

import ast
import json
import math
from functools import lru_cache
from pathlib import Path

import torch

VLLM_INDEX = Path(__file__).with_name("vllm_index.json")
# the stages a request passes through, in order; a trace must visit each
STAGES = ("entry", "engine", "scheduler", "cache", "model", "output")
REQUIRED_STAGES = ("entry", "scheduler", "cache", "model", "output")


def contiguous_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) v per sequence over all its cached keys (a decode step: the query is the
    newest token, so no causal mask is needed). Computed and returned in fp32, (B, n_head, hd)."""
    B, H, hd = q.shape
    out = torch.empty(B, H, hd, dtype=torch.float32)
    for b in range(B):
        k, v = keys[b].float(), values[b].float()  # (kv_heads, L, hd)
        group = H // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # (H, L, hd)
        scores = torch.einsum("hd,hld->hl", q[b].float(), k) / math.sqrt(hd)
        out[b] = torch.einsum("hl,hld->hd", scores.softmax(-1), v)
    return out


def state_violations(state, num_blocks: int, *, shared_allowed: bool) -> list[str]:
    """What is wrong with an allocator's reported state (empty when nothing): free + used = total, every
    reference count equal to the number of block tables holding the block, no block twice in one table, and
    without prefix caching (shared_allowed False) no block owned by two sequences."""
    if not isinstance(state, dict) or not {"free", "ref_counts", "block_tables"} <= set(state):
        return [f"state() must return a dict with 'free', 'ref_counts' and 'block_tables', got {state!r:.200}"]
    free, refs, tables = state["free"], state["ref_counts"], state["block_tables"]
    if not isinstance(refs, list) or len(refs) != num_blocks or not all(type(r) is int for r in refs):
        return [f"'ref_counts' must be a list of {num_blocks} ints (one per block), got {refs!r:.200}"]
    if not isinstance(free, list) or not all(type(b) is int and 0 <= b < num_blocks for b in free):
        return [f"'free' must be a list of block ids in 0..{num_blocks - 1}, got {free!r:.200}"]
    if not isinstance(tables, dict) or not all(isinstance(t, list) and all(type(b) is int and 0 <= b < num_blocks
                                                                           for b in t) for t in tables.values()):
        return [f"'block_tables' must map each sequence to a list of block ids, got {tables!r:.200}"]
    problems = []
    if len(set(free)) != len(free):
        problems.append(f"the free list holds a block twice: {sorted(b for b in set(free) if free.count(b) > 1)}")
    used = [b for b in range(num_blocks) if refs[b] > 0]
    if any(r < 0 for r in refs):
        problems.append(f"negative reference counts: blocks {[b for b in range(num_blocks) if refs[b] < 0]}")
    if set(free) & set(used):
        problems.append(f"blocks both free and referenced: {sorted(set(free) & set(used))}")
    if len(set(free)) + len(used) != num_blocks and not set(free) & set(used):
        lost = sorted(set(range(num_blocks)) - set(free) - set(used))
        problems.append(f"free ({len(set(free))}) + used ({len(used)}) != total ({num_blocks}); blocks neither free "
                        f"nor referenced (leaked): {lost[:10]}")
    holders: dict[int, list] = {}
    for seq, table in tables.items():
        if len(set(table)) != len(table):
            problems.append(f"sequence {seq!r}'s block table holds a block twice: {table}")
        for b in set(table):
            holders.setdefault(b, []).append(seq)
    for b in range(num_blocks):
        n = len(holders.get(b, ()))
        if refs[b] != n:
            problems.append(f"block {b} has reference count {refs[b]} but {n} block tables hold it "
                            f"({holders.get(b, [])[:4]})")
        if n > 1 and not shared_allowed:
            problems.append(f"block {b} is owned by {n} sequences {holders[b][:4]} without prefix caching: each "
                            "sequence must get blocks nobody else holds")
    return problems[:6]


# --- the pinned vLLM release ------------------------------------------------------------------------------------
# The files a completion request passes through, by stage (vLLM 0.34.0's V1 engine).
VLLM_FILES = {
    "vllm/entrypoints/launchers/api_server/entry.py": "entry",
    "vllm/entrypoints/launchers/api_server/routers.py": "entry",
    "vllm/entrypoints/launchers/launcher.py": "entry",
    "vllm/entrypoints/openai/completion/api_router.py": "entry",
    "vllm/entrypoints/openai/completion/serving.py": "entry",
    "vllm/v1/engine/async_llm.py": "engine",
    "vllm/v1/engine/llm_engine.py": "engine",
    "vllm/v1/engine/input_processor.py": "engine",
    "vllm/v1/engine/core_client.py": "engine",
    "vllm/v1/engine/core.py": "engine",
    "vllm/v1/request.py": "engine",
    "vllm/v1/core/sched/scheduler.py": "scheduler",
    "vllm/v1/core/sched/request_queue.py": "scheduler",
    "vllm/v1/core/sched/output.py": "scheduler",
    "vllm/v1/core/kv_cache_manager.py": "cache",
    "vllm/v1/core/kv_cache_coordinator.py": "cache",
    "vllm/v1/core/single_type_kv_cache_manager.py": "cache",
    "vllm/v1/core/block_pool.py": "cache",
    "vllm/v1/core/kv_cache_utils.py": "cache",
    "vllm/v1/executor/abstract.py": "model",
    "vllm/v1/executor/uniproc_executor.py": "model",
    "vllm/v1/worker/gpu_worker.py": "model",
    "vllm/v1/worker/gpu/model_runner.py": "model",
    "vllm/v1/worker/gpu/block_table.py": "model",
    "vllm/v1/worker/gpu/input_batch.py": "model",
    "vllm/v1/attention/backends/flash_attn.py": "model",
    "vllm/v1/engine/output_processor.py": "output",
    "vllm/v1/engine/detokenizer.py": "output",
}


def defined_names(source: str) -> list[str]:
    """Top-level functions and classes of a Python file, and each class's methods as 'Class.method'."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names.append(node.name)
            names += [f"{node.name}.{m.name}" for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return sorted(set(names))


def build_vllm_index(root: Path, version: str, commit: str) -> dict:
    """The index shipped with the course (vllm_index.json), built from a vLLM source tree at `root` (the
    release's sdist unpacked: its vllm/_version.py names the commit)."""
    files = {path: {"stage": stage, "defs": defined_names((Path(root) / path).read_text())}
             for path, stage in VLLM_FILES.items() if (Path(root) / path).exists()}
    return {"project": "vllm", "version": version, "commit": commit, "stages": list(STAGES), "files": files}


@lru_cache(maxsize=1)
def vllm_index() -> dict:
    return json.loads(VLLM_INDEX.read_text())


if __name__ == "__main__":  # python -m infracourse.kit.paged_reference SRC VERSION COMMIT
    import sys
    VLLM_INDEX.write_text(json.dumps(build_vllm_index(Path(sys.argv[1]), sys.argv[2], sys.argv[3]), indent=1) + "\n")
