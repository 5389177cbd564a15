"""The paged KV pool on the device (needs cuda): the course's model and its paged K/V pool live on the GPU, your
allocator places every token and your paged_attention reads the pool there. The shared-prefix workload (8
requests sharing a 100-token system prompt, 16-token blocks, prefix caching on) runs through a pool of 256 blocks
of a wider model; every request's tokens must equal the judge's full recomputation on the same device, the
pool's bytes as the device's allocator counts them (torch.cuda.memory_allocated around its allocation, in the
judge's process: nothing of the learner's reports them) must equal the formula, and the bytes held at the end
follow from the blocks in use."""
import pytest
import torch

from infracourse.grader import LabCheckFailed
from infracourse.kit import paged_generation as pg
from infracourse.kit.generate import greedy_generate
from infracourse.kit.gpt import GPTConfig
from infracourse.kit.paged_generation import InvalidAnswer, PagedGeneration
from week16_judging import check_pool_bytes

GPU_MODEL = GPTConfig(vocab_size=256, seq_len=160, d_model=512, n_head=8, n_kv_head=2, n_layer=4)
GPU_BLOCKS = 256


@pytest.mark.check("gpu-paged")
def test_paged_pool_on_the_device(paged, seed, record):
    cfg = GPU_MODEL
    gen = PagedGeneration(paged, seed=seed, blocks=GPU_BLOCKS, block_size=pg.BLOCK, prefix_caching=True, cfg=cfg,
                          device="cuda", engine_device="cuda")
    what = (f"seed {seed}: a pool of {GPU_BLOCKS} blocks of {pg.BLOCK} tokens on the device, {cfg.n_layer} layers, "
            f"{cfg.kv_heads} KV heads of {cfg.head_dim}, fp32")
    formula = gen.kv_bytes(GPU_BLOCKS)
    record("KV pool bytes (device)", gen.pool_device_bytes or 0, unit="B", source="device",
           label="torch.cuda.memory_allocated around the pool's allocation")
    record("KV pool bytes (formula)", formula, unit="B",
           label="2 x layers x blocks x block_size x KV heads x head_dim x 4")
    check_pool_bytes(gen.pool_device_bytes, formula, 2 * cfg.n_layer, what)
    prompts = pg.shared_prefix_prompts(seed)
    for i, prompt in enumerate(prompts):
        try:
            run = gen.generate(f"req{i}", prompt, pg.NEW)
        except InvalidAnswer as exc:
            raise LabCheckFailed(f"{what}, request {i + 1}: {exc}") from None
        with torch.no_grad():
            want = greedy_generate(gen.model, prompt, pg.NEW)
        if run.tokens != want:
            j = next(j for j, (a, b) in enumerate(zip(run.tokens, want)) if a != b)
            raise LabCheckFailed(f"{what}, request {i + 1}: token {j} through your block table and paged_attention "
                                 f"on the device is {run.tokens[j]}, full recomputation {want[j]}")
        want_cached = pg.EXPECTED_CACHED if i else 0
        if run.cached != want_cached:
            raise LabCheckFailed(f"{what}, request {i + 1}: allocate returned {run.cached} cached tokens, the shared "
                                 f"system prompt's full blocks hold {want_cached}")
    used = GPU_BLOCKS - len(gen.allocator.state()["free"])
    held = gen.pool_device_bytes * used // GPU_BLOCKS
    record("KV bytes held (device)", held, unit="B", source="device", label=f"{used} blocks in use, all requests live")
    record("KV bytes held (formula)", gen.kv_bytes(used), unit="B")
    if abs(held - gen.kv_bytes(used)) > 512 * 2 * cfg.n_layer:
        raise LabCheckFailed(f"{what}: {used} blocks in use hold {held} bytes of the device's pool; the formula "
                             f"gives {gen.kv_bytes(used)}")
