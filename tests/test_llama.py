"""kit.llama: the decoder served from a checkpoint equals a plain computation written out here (grouped-query
attention by repeating each KV head, RoPE on explicit pairs), its KV cache reproduces the full forward, and the
cache's bytes follow the formula. Run on CUDA too when one is present."""
import math

import pytest
import torch

from infracourse.kit.hf_checkpoint import LlamaConfig, load_checkpoint, make_checkpoint, random_tensors
from infracourse.kit.llama import Llama, generate

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CFG = LlamaConfig(layers=2, hidden=64, heads=8, kv_heads=2, vocab=101, intermediate=160, rope_theta=500.0)


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """x (heads, T, hd): pair j with j + hd/2, turned by angle pos * theta^(-2j/hd)."""
    hd = x.shape[-1]
    out = x.clone()
    for j in range(hd // 2):
        ang = pos[:, None].double() * theta ** (-2 * j / hd)
        c, s = torch.cos(ang).float()[:, 0], torch.sin(ang).float()[:, 0]
        a, b = x[..., j], x[..., j + hd // 2]
        out[..., j], out[..., j + hd // 2] = a * c - b * s, b * c + a * s
    return out


def plain_logits(t: dict, cfg: LlamaConfig, ids: torch.Tensor, kv_head_of=lambda h, group: h // group):
    """One sequence (T,) -> (T, vocab), in fp32 loops: query head h reads KV head kv_head_of(h)."""
    T, hd = ids.shape[0], cfg.head_dim
    group = cfg.heads // cfg.kv_heads
    pos = torch.arange(T)
    x = t["model.embed_tokens.weight"][ids]
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        h = rms(x, t[p + "input_layernorm.weight"], cfg.rms_eps)
        q = (h @ t[p + "self_attn.q_proj.weight"].T).view(T, cfg.heads, hd).transpose(0, 1)
        k = (h @ t[p + "self_attn.k_proj.weight"].T).view(T, cfg.kv_heads, hd).transpose(0, 1)
        v = (h @ t[p + "self_attn.v_proj.weight"].T).view(T, cfg.kv_heads, hd).transpose(0, 1)
        q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        heads = []
        for qh in range(cfg.heads):  # repeat-kv, spelled out: each query head with its group's K and V
            kh = kv_head_of(qh, group)
            scores = q[qh] @ k[kh].T / math.sqrt(hd)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            heads.append(torch.softmax(scores, -1) @ v[kh])
        x = x + torch.cat(heads, dim=-1) @ t[p + "self_attn.o_proj.weight"].T
        h = rms(x, t[p + "post_attention_layernorm.weight"], cfg.rms_eps)
        gate = h @ t[p + "mlp.gate_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * (h @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    return rms(x, t["model.norm.weight"], cfg.rms_eps) @ t["lm_head.weight"].T


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    make_checkpoint(folder, CFG, seed=5, shard_mb=0.05)
    return folder


def test_grouped_query_attention_matches_a_plain_repeat_kv_computation(ckpt):
    model = Llama.from_checkpoint(ckpt)
    t = random_tensors(CFG, seed=5)
    ids = torch.randint(CFG.vocab, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids)
    for b in range(2):
        want = plain_logits(t, CFG, ids[b])
        torch.testing.assert_close(got[b], want, atol=1e-4, rtol=1e-4)
    # the comparison tells a wrong grouping apart: KV heads assigned round-robin (h % kv_heads), what a
    # model that tiles the KV heads (repeat instead of repeat_interleave) computes
    wrong = plain_logits(t, CFG, ids[0], kv_head_of=lambda h, group: h % CFG.kv_heads)
    assert (got[0] - wrong).abs().max() > 1e-2


def test_a_model_built_ignoring_num_key_value_heads_cannot_load(ckpt):
    # a loader that ignores num_key_value_heads builds K/V projections with one head per query head
    _, tensors = load_checkpoint(ckpt)
    wrong = LlamaConfig(**{**CFG.__dict__, "kv_heads": CFG.heads})
    with pytest.raises(RuntimeError, match="k_proj.weight"):
        Llama.from_tensors(wrong, tensors)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 6e-2)])
def test_prefill_then_decode_with_the_cache_equals_the_full_forward(ckpt, device, dtype, tol):
    model = Llama.from_checkpoint(ckpt, device=device, dtype=dtype)
    assert model.device.type == device and model.dtype == dtype
    ids = torch.randint(CFG.vocab, (3, 20), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        full = model(ids).float()
        cache = model.new_cache(batch=3, max_len=24)
        pieces = [model(ids[:, :13], cache)] + [model(ids[:, i:i + 1], cache) for i in range(13, 20)]
    assert cache.length == 20
    torch.testing.assert_close(torch.cat(pieces, dim=1).float(), full, atol=tol, rtol=tol)
    assert cache.k[0].device.type == device and cache.k[0].dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_bytes_formula_equals_the_cache_tensors_nbytes(ckpt, dtype):
    model = Llama.from_checkpoint(ckpt, dtype=dtype)
    cache = model.new_cache(batch=3, max_len=40)
    per_token = 2 * CFG.layers * CFG.kv_heads * CFG.head_dim * torch.tensor([], dtype=dtype).element_size()
    assert CFG.kv_bytes_per_token(dtype) == per_token
    assert cache.nbytes == sum(t.nbytes for t in cache.k + cache.v) == per_token * 3 * 40
    assert cache.k[0].shape == (3, CFG.kv_heads, 40, CFG.head_dim)  # KV heads cached, not query heads


def test_greedy_generation_equals_recomputing_the_whole_sequence(ckpt):
    model = Llama.from_checkpoint(ckpt)
    prompt = torch.randint(CFG.vocab, (2, 9), generator=torch.Generator().manual_seed(2))
    got = generate(model, prompt, new_tokens=6)
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got, seq[:, 9:])


def test_tied_embeddings_share_one_tensor_and_the_cache_refuses_overflow(tmp_path):
    cfg = LlamaConfig(layers=1, hidden=32, heads=4, kv_heads=1, vocab=50, tie_embeddings=True, max_positions=16)
    make_checkpoint(tmp_path, cfg)
    model = Llama.from_checkpoint(tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cache = model.new_cache(1, 4)
    with torch.no_grad(), pytest.raises(ValueError, match="holds 4 tokens; 5 asked"):
        model(torch.zeros(1, 5, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_position_embeddings 16"):
        model.new_cache(1, 17)


def test_the_in_process_engine_serves_the_checkpoint_to_the_load_matrix(ckpt, tmp_path):
    from infracourse.kit.llama_serving import Engine
    from infracourse.kit.load_matrix import check_matrix, load_matrix, run_matrix
    from infracourse.kit.loadgen import read_records, request_matrix

    engine = Engine(Llama.from_checkpoint(ckpt))
    cells = load_matrix([6], [3], concurrencies=[2], rates=[40.0], requests=3)
    rows = run_matrix(cells, tmp_path, seed=9, send=engine.send, vocab_size=CFG.vocab)
    assert check_matrix(tmp_path, cells) == [] and all(r["metrics"]["failure_rate"] == 0 for r in rows)
    records, _, _ = read_records(tmp_path / f"{cells[0].name}.json")
    specs = request_matrix([6], [3], 3, vocab_size=CFG.vocab, seed=9)  # what run_matrix sent to cell 0
    for spec, rec in zip(specs, records):
        want = generate(engine.model, torch.tensor([spec.prompt_ids]), 3)[0].tolist()
        assert rec.output_tokens == 3 and rec.text.split() == [str(t) for t in want]
    mem = engine.memory()
    assert mem["source"] == "cpu-stand-in" and "standing in for device memory" in mem["measure"]
    assert mem["kv_peak_bytes"] == CFG.kv_bytes_per_token(torch.float32) * (6 + 3)
    assert mem["weights_bytes"] == sum(t.nbytes for t in random_tensors(CFG, seed=5).values())


@pytest.mark.parametrize("tie", [False, True])
def test_decode_flops_and_bytes_formulas_against_counted_flops_and_real_bytes(tmp_path, tie):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from infracourse.kit.llama_serving import decode_bytes, decode_flops

    cfg = LlamaConfig(**{**CFG.__dict__, "tie_embeddings": tie})
    make_checkpoint(tmp_path, cfg)
    model = Llama.from_checkpoint(tmp_path, dtype=torch.bfloat16)
    batch, context = 3, 17
    cache = model.new_cache(batch, context)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):  # the plain matmuls, which the counter sees
        model(torch.zeros(batch, context - 1, dtype=torch.long), cache)
        with FlopCounterMode(display=False) as counted:
            model(torch.zeros(batch, 1, dtype=torch.long), cache)
    assert decode_flops(cfg, batch, context) == counted.get_total_flops()
    weights = sum(p.nbytes for p in model.parameters()) - (0 if tie else model.model.embed_tokens.weight.nbytes)
    assert decode_bytes(cfg, batch, context, torch.bfloat16) == weights + cache.nbytes  # cache full: context


def test_phase_times_measures_every_batch_and_prompt_length(ckpt):
    from infracourse.kit.llama_serving import phase_times

    rows = phase_times(Llama.from_checkpoint(ckpt), [8, 24], [1, 2], new_tokens=3, repeats=1)
    assert [(r["batch"], r["prompt"]) for r in rows] == [(1, 8), (1, 24), (2, 8), (2, 24)]
    assert all(r["prefill_ms"] > 0 and r["decode_ms_per_step"] > 0 for r in rows)
    assert rows[3]["kv_cache_bytes"] == 2 * 27 * CFG.kv_bytes_per_token(torch.float32)
    assert rows[3]["flops_per_byte"] > rows[1]["flops_per_byte"]  # a batch reads the weights once for more tokens
    with pytest.raises(ValueError, match="new_tokens >= 2"):
        phase_times(Llama.from_checkpoint(ckpt), [8], [1], new_tokens=1)


def test_llama3_rope_scaling_follows_the_piecewise_rule_and_round_trips(tmp_path):
    from infracourse.kit.llama import rope_frequencies

    raw = {**CFG.to_hf(), "head_dim": 64, "hidden_size": 512, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}
    cfg = LlamaConfig.from_hf(raw)
    assert cfg.rope_llama3 == (32.0, 1.0, 4.0, 8192) and LlamaConfig.from_hf(cfg.to_hf()) == cfg
    want = []  # Meta's rule, one frequency at a time (this config: 15 kept, 3 blended, 14 slowed)
    for i in range(32):
        freq = 1.0 / 500000.0 ** (2 * i / 64)
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4.0:
            want.append(freq)
        elif wavelen > 8192 / 1.0:
            want.append(freq / 32.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            want.append((1 - smooth) * freq / 32.0 + smooth * freq)
    got = rope_frequencies(cfg).double()
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
    assert got[0] == want[0] and got[-1] < 1.0 / 500000.0 ** (62 / 64) / 31  # short kept, long slowed
    plain = rope_frequencies(LlamaConfig.from_hf({**raw, "rope_scaling": None}))
    assert not torch.equal(plain, rope_frequencies(cfg))
