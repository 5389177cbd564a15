"""The serving kit: GPT pieces for incremental decoding, byte tokenizer, reference greedy generation, and the
load generator's metric definitions on fixed traces (vLLM's calculate_metrics), plus one run over a Unix socket."""
import asyncio
import json
import math
import os
import tempfile
import threading

import numpy as np
import pytest
import torch

from infracourse.kit.generate import greedy_generate, greedy_stream, seeded_prompts
from infracourse.kit.gpt import GPT, GPTConfig
from infracourse.kit.loadgen import (RequestRecord, RequestSpec, arrival_offsets, compute_metrics, request_matrix,
                                     run_load)
from infracourse.kit.tokenizer import ByteTokenizer


def test_tokenizer_round_trip():
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓")
    assert ids[:3] == [104, 195, 169] and all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == "héllo ✓"
    assert tok.decode(ids[:2]) == "h\ufffd"
    with pytest.raises(ValueError):
        tok.decode([256])


def test_default_config_has_no_grouping_and_weights_unchanged():
    cfg = GPTConfig()
    assert cfg.n_kv_head is None and cfg.kv_heads == cfg.n_head and cfg.head_dim == 16
    m = GPT(cfg, seed=0)
    assert m.blocks[0].attn.qkv.weight.shape == (3 * cfg.d_model, cfg.d_model)
    with pytest.raises(ValueError):
        GPTConfig(n_head=4, n_kv_head=3)


def _cached_logits(model, ids, split):
    """Prefill ids[:, :split], then decode one token at a time through the kit's pieces with a growing cache."""
    with torch.no_grad():
        x = model.embed(ids[:, :split], 0)
        cache = []
        for b in model.blocks:
            q, k, v = b.attn.qkv_heads(b.norm1(x))
            cache.append((k, v))
            x = x + b.attn.attend(q, k, v)
            x = x + b.mlp(b.norm2(x))
        out = [model.logits(x)]
        for t in range(split, ids.shape[1]):
            x = model.embed(ids[:, t:t + 1], t)
            for i, b in enumerate(model.blocks):
                q, k, v = b.attn.qkv_heads(b.norm1(x))
                cache[i] = (torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2))
                x = x + b.attn.attend(q, *cache[i])
                x = x + b.mlp(b.norm2(x))
            out.append(model.logits(x))
    return torch.cat(out, 1), cache


@pytest.mark.parametrize("kv", [None, 2, 1])
def test_pieces_with_a_cache_equal_the_full_forward(kv):
    cfg = GPTConfig(seq_len=48, n_head=4, n_kv_head=kv)
    model = GPT(cfg, seed=1).eval()
    ids = torch.randint(256, (2, 40), generator=torch.Generator().manual_seed(0))
    got, cache = _cached_logits(model, ids, 25)
    torch.testing.assert_close(got, model(ids), rtol=1e-4, atol=1e-5)
    assert cache[0][0].shape == (2, cfg.kv_heads, 40, cfg.head_dim)


def test_attend_key_mask_ignores_padding():
    cfg = GPTConfig(seq_len=32, n_kv_head=2)
    model = GPT(cfg, seed=2).eval()
    attn = model.blocks[0].attn
    x = torch.randn(1, 10, cfg.d_model)
    with torch.no_grad():
        q, k, v = attn.qkv_heads(x)
        pad = torch.randn(1, cfg.kv_heads, 3, cfg.head_dim)
        mask = torch.tensor([[False] * 3 + [True] * 10])
        got = attn.attend(q, torch.cat([pad, k], 2), torch.cat([pad, v], 2), key_mask=mask)
        torch.testing.assert_close(got, attn(x), rtol=1e-4, atol=1e-5)


def test_greedy_reference_and_stream_agree():
    model = GPT(GPTConfig(seq_len=40), seed=3).eval()
    prompt = seeded_prompts(1, 256, 5, 12, seed=4)[0]
    tokens, logits = greedy_generate(model, prompt, 10, return_logits=True)
    assert tokens == list(greedy_stream(model, prompt, 10)) and logits.shape == (10, 256)
    assert tokens == logits.argmax(-1).tolist()
    with torch.no_grad():  # step 0 is the argmax of the prompt's last position
        assert tokens[0] == int(model(torch.tensor([prompt]))[0, -1].argmax())
    with pytest.raises(ValueError):
        greedy_generate(model, prompt, 40)


def _rec(send, chunks, n, ok=True, prompt=10):
    return RequestRecord(prompt_tokens=prompt, send_time=send, chunk_times=chunks, output_tokens=n, success=ok)


def test_metrics_on_a_fixed_trace():
    records = [_rec(0.0, [0.1, 0.15, 0.25, 0.3], 4),      # ttft .1, itl .05 .1 .05, e2el .3, tpot .2/3
               _rec(0.5, [0.7], 1, prompt=20),              # one token: no TPOT sample, TPOT 0 for goodput
               _rec(1.0, [], 0, ok=False),                  # failed: excluded everywhere
               _rec(1.0, [1.4, 1.5, 1.6], 5, prompt=30)]   # 5 tokens in 3 chunks: tpot (.6 - .4) / 4 = .05
    m = compute_metrics(records, 2.0, percentiles=(50, 90, 99), goodput_slo_ms={"ttft": 250})
    assert (m["completed"], m["failed"], m["total_input"], m["total_output"]) == (3, 1, 60, 10)
    assert m["request_throughput"] == 1.5 and m["output_throughput"] == 5.0 and m["total_token_throughput"] == 35.0
    ttft = np.array([0.1, 0.2, 0.4]) * 1000
    assert m["ttft_ms"]["mean"] == pytest.approx(ttft.mean()) and m["ttft_ms"]["median"] == pytest.approx(200)
    assert m["ttft_ms"]["p90"] == pytest.approx(np.percentile(ttft, 90)) == pytest.approx(360)  # linear
    assert m["tpot_ms"]["mean"] == pytest.approx((0.2 / 3 + 0.05) / 2 * 1000)
    itl = np.array([0.05, 0.1, 0.05, 0.1, 0.1]) * 1000
    assert m["itl_ms"]["p50"] == pytest.approx(np.percentile(itl, 50))
    assert m["itl_ms"]["std"] == pytest.approx(itl.std())
    assert m["e2el_ms"]["p99"] == pytest.approx(np.percentile([300, 200, 600], 99))
    assert m["request_goodput"] == pytest.approx(2 / 2.0)  # ttft .1 and .2 meet 250 ms (inclusive), .4 does not
    g = compute_metrics(records, 2.0, goodput_slo_ms={"ttft": 400, "tpot": 60})  # tpot .0667 fails the first
    assert g["request_goodput"] == pytest.approx(1.0)  # the one-token request (tpot 0) and the last
    assert compute_metrics(records, 2.0)["request_goodput"] is None


def test_metrics_with_nothing_completed_report_zero():
    m = compute_metrics([_rec(0.0, [], 0, ok=False)], 1.0)
    assert m["completed"] == 0 and m["ttft_ms"]["p99"] == 0.0 and m["output_throughput"] == 0.0


def test_arrivals():
    assert arrival_offsets(4, math.inf) == [0.0] * 4
    poisson = np.diff(arrival_offsets(20001, 50.0, 1.0, seed=1))
    bursty = np.diff(arrival_offsets(20001, 50.0, 0.25, seed=1))
    assert poisson.mean() == pytest.approx(0.02, rel=0.03) and bursty.mean() == pytest.approx(0.02, rel=0.05)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.08)   # gamma shape k: CV 1/sqrt(k)
    assert arrival_offsets(5, 10.0, seed=3) == arrival_offsets(5, 10.0, seed=3)


def test_request_matrix():
    specs = request_matrix([4, 8], [2, 3], 2, seed=0)
    assert len(specs) == 8
    cells = sorted([(i, o) for i in (4, 8) for o in (2, 3)] * 2)
    assert sorted((len(s.prompt_ids), s.max_tokens) for s in specs) == cells


def _serve_uds(path, ready, stop_box):
    """A minimal streaming /v1/completions server on a Unix socket (plain asyncio, HTTP/1.1, body until close)."""

    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
        body = json.loads(await reader.readexactly(length))
        if body["max_tokens"] == 99:
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\nboom")
        else:
            chunked = body["max_tokens"] == 6  # one request in chunked transfer encoding, as uvicorn streams

            def send(data: bytes):
                writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)

            te = b"Transfer-Encoding: chunked\r\n" if chunked else b"Connection: close\r\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + te + b"\r\n")
            for i in range(body["max_tokens"]):
                await asyncio.sleep(0.005)
                chunk = {"choices": [{"index": 0, "text": chr(97 + i % 26)}]}
                send(f"data: {json.dumps(chunk)}\n\n".encode())
                await writer.drain()
            usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                              "completion_tokens": body["max_tokens"]}}
            send(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            if chunked:
                writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_unix_server(handle, path)
        stop = asyncio.Event()
        stop_box.append((asyncio.get_running_loop(), stop))
        ready.set()
        await stop.wait()
        server.close()

    asyncio.run(main())


def test_run_load_over_a_unix_socket():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.sock")
        ready, box = threading.Event(), []
        th = threading.Thread(target=_serve_uds, args=(path, ready, box), daemon=True)
        th.start()
        assert ready.wait(10)
        try:
            specs = [RequestSpec([1, 2, 3], 4), RequestSpec([5] * 7, 6), RequestSpec([1], 99)]
            records, duration = run_load(specs, uds=path, rate=100.0, concurrency=2, seed=0)
        finally:
            loop, stop = box[0]
            loop.call_soon_threadsafe(stop.set)
            th.join(10)
    assert [r.success for r in records] == [True, True, False] and "HTTP 500" in records[2].error
    assert records[0].text == "abcd" and records[1].output_tokens == 6 and len(records[1].chunk_times) == 6
    assert all(r.ttft > 0 and r.e2el >= r.ttft for r in records[:2])
    m = compute_metrics(records, duration)
    assert m["completed"] == 2 and m["total_output"] == 10 and m["total_input"] == 10


# --- week 17: raw records on disk, serving cost, the batching kit, the judge's server launcher -------------------

def test_records_round_trip_and_recompute(tmp_path):
    from infracourse.kit.loadgen import read_records, write_records

    records = [RequestRecord(8, 1.0, [1.1, 1.2, 1.4], 3, True, "", "abc"), RequestRecord(24, 1.05, [], 0, False,
                                                                                       "HTTP 429", "")]
    write_records(tmp_path / "r.json", records, 0.5, concurrency=32, arrivals="all at once")
    back, duration, conditions = read_records(tmp_path / "r.json")
    assert back == records and duration == 0.5 and conditions == {"concurrency": 32, "arrivals": "all at once"}
    assert compute_metrics(back, duration) == compute_metrics(records, 0.5)
    (tmp_path / "bad.json").write_text(json.dumps({"duration_s": 1, "records": [{"prompt_tokens": 1}]}))
    with pytest.raises(ValueError, match="exactly the fields"):
        read_records(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text(json.dumps({"duration_s": 0, "records": []}))
    with pytest.raises(ValueError, match="duration_s"):
        read_records(tmp_path / "bad.json")


def test_serving_cost_counts_the_whole_wall_time():
    from infracourse.kit.loadgen import serving_cost

    m = {"duration_s": 36.0, "completed": 10, "total_output": 200}
    cost = serving_cost(m, 2.0)  # 36 s at $2/h = $0.02, idle moments included
    assert math.isclose(cost["run_usd"], 0.02) and math.isclose(cost["usd_per_request"], 0.002)
    assert math.isclose(cost["usd_per_1m_output_tokens"], 0.02 / 200 * 1e6)
    assert serving_cost({"duration_s": 1.0, "completed": 0, "total_output": 0}, 2.0)["usd_per_request"] == math.inf


def test_forward_batch_ragged_chunked_and_recomputed_equals_greedy():
    """Prefills, decodes, a prompt split in two chunks and a sequence recomputed from scratch in one step, over
    scattered blocks: each sequence's tokens are sequential greedy generation's."""
    from infracourse.kit.batching import SERVE_GPT, KVPool, Piece, ServeConfig, forward_batch, serve_model

    model = serve_model(ServeConfig(seed=3))
    pool = KVPool(SERVE_GPT, 40, 4)
    prompts = seeded_prompts(3, 128, 3, 20, seed=1)
    tables = [[30, 2, 17, 5, 9, 11, 23], [1, 0, 38, 7, 12, 13, 14], [39, 3, 4, 6, 8, 10, 15]]
    want = [greedy_generate(model, p, 6) for p in prompts]
    out = [[] for _ in prompts]
    half = len(prompts[2]) // 2
    forward_batch(model, pool, [Piece(prompts[2][:half], 0, tables[2])])          # a chunk: no token from it
    first = forward_batch(model, pool, [Piece(prompts[0], 0, tables[0]), Piece(prompts[1], 0, tables[1]),
                                        Piece(prompts[2][half:], half, tables[2])]).argmax(-1).tolist()
    for o, t in zip(out, first):
        o.append(t)
    for step in range(5):
        pieces = [Piece([o[-1]], len(p) + len(o) - 1, tb) for p, o, tb in zip(prompts, out, tables)]
        if step == 2:  # sequence 1 preempted and recomputed: prompt + its tokens in one piece, fresh blocks
            pieces[1] = Piece(prompts[1] + out[1], 0, [20, 21, 22, 24, 25, 26, 27])
            tables[1] = pieces[1].block_table
        for o, t in zip(out, forward_batch(model, pool, pieces).argmax(-1).tolist()):
            o.append(t)
    assert out == want
    with pytest.raises(ValueError, match="block table holds"):
        forward_batch(model, pool, [Piece([1] * 5, 0, [0])])


def test_forward_batch_serves_a_llama_checkpoint_as_its_own_cached_forward(tmp_path):
    """A tiny Llama checkpoint (fp32, vocabulary 128) through the paged pool: prefills, a prompt in two chunks,
    decodes and a recomputation, alone and mixed in one step, give each piece's last-token logits of kit.llama's
    plain forward with its contiguous KVCache (RoPE at each token's own position, grouped KV heads); the pool
    takes the model's dtype; the runner's memory figures say they are a CPU stand-in."""
    from infracourse.kit.batching import KVPool, ModelRunner, Piece, ServeConfig, forward_batch, serve_model
    from infracourse.kit.hf_checkpoint import make_and_describe

    sizes = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 128, "intermediate": 96,
             "max_positions": 128}
    make_and_describe(tmp_path / "ckpt", sizes, dtype="fp32", seed=5)
    cfg = ServeConfig(model=str(tmp_path / "ckpt"), num_blocks=40, block_size=4)
    model = serve_model(cfg)
    pool = KVPool(model.cfg, cfg.num_blocks, cfg.block_size)
    prompts = seeded_prompts(4, 128, 3, 20, seed=2)
    tables = [[30, 2, 17, 5, 9, 11, 23], [1, 0, 38, 7, 12, 13, 14], [39, 3, 4, 6, 8, 10, 15],
              [16, 18, 19, 28, 29, 31, 32]]
    caches = [model.new_cache(1, 40) for _ in prompts]
    seqs = [list(p) for p in prompts]

    def plain(i: int, tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([tokens]), caches[i])[0, -1]

    def step(pieces: dict[int, Piece]) -> None:
        got = forward_batch(model, pool, list(pieces.values()))
        for row, (i, piece) in enumerate(pieces.items()):
            want = plain(i, piece.tokens)
            assert torch.allclose(got[row], want, atol=1e-4), (i, (got[row] - want).abs().max())
            if piece.start + len(piece.tokens) == len(seqs[i]):
                seqs[i].append(int(want.argmax()))

    half = len(prompts[2]) // 2
    step({2: Piece(prompts[2][:half], 0, tables[2])})                                 # a chunk alone
    step({0: Piece(prompts[0], 0, tables[0]), 1: Piece(prompts[1], 0, tables[1]),   # prefills and a chunk
          2: Piece(prompts[2][half:], half, tables[2])})
    for n in range(4):
        pieces = {i: Piece(seqs[i][-1:], len(seqs[i]) - 1, tables[i]) for i in range(3)}   # decodes ...
        if n == 1:
            pieces[3] = Piece(prompts[3], 0, tables[3])                                 # ... with a prefill
        if n == 2:  # sequence 1 recomputed from position 0 in fresh blocks, beside decodes
            caches[1], tables[1] = model.new_cache(1, 40), [20, 21, 22, 24, 25, 26, 27]
            pieces[1] = Piece(list(seqs[1]), 0, tables[1])
        if n >= 2:
            pieces[3] = Piece(seqs[3][-1:], len(seqs[3]) - 1, tables[3])
        step(pieces)
    runner = ModelRunner(cfg)
    assert runner.pool.k.dtype == next(runner.model.parameters()).dtype == torch.float32
    assert runner.memory["source"] == "cpu-stand-in" and runner.memory["kv_pool_bytes"] == runner.pool.nbytes
    assert runner.memory["kv_pool_bytes"] == runner.memory["kv_pool_formula"] == 2 * 2 * 2 * 16 * 40 * 4 * 4
    with pytest.raises(ValueError, match="vocabulary 128"):
        make_and_describe(tmp_path / "wide", {**sizes, "vocab": 256}, dtype="fp32")
        serve_model(ServeConfig(model=str(tmp_path / "wide")))


def test_serve_config_from_env_and_model_runner_floor():
    import time

    from infracourse.kit.batching import ModelRunner, Piece, ServeConfig

    cfg = ServeConfig.from_env({"INFRACOURSE_SERVE": json.dumps({"num_blocks": 8, "step_floor_ms": 30})})
    assert cfg.num_blocks == 8 and cfg.max_num_seqs == ServeConfig().max_num_seqs
    assert ServeConfig.from_env(cfg.to_env()) == cfg
    with pytest.raises(ValueError, match="unknown field"):
        ServeConfig.from_env({"INFRACOURSE_SERVE": '{"blocks": 8}'})
    runner = ModelRunner(cfg)
    started = time.perf_counter()
    runner.step([Piece([1, 2, 3], 0, [0])])
    assert time.perf_counter() - started >= 0.03 and runner.pool.nbytes == 2 * 2 * 2 * 8 * 8 * 16 * 4


def test_serve_starts_answers_and_reports_a_crash(tmp_path):
    from infracourse.grading.serving import ServerFailed, serve

    app = tmp_path / "app"
    app.mkdir()
    (app / "server.py").write_text(
        "import os\nfrom fastapi import FastAPI\napp = FastAPI()\n"
        "@app.get('/health')\ndef health():\n    return {'ok': True}\n"
        "@app.get('/die')\ndef die():\n    print('dying now', flush=True)\n    os._exit(3)\n")
    with serve(app, "server:app", scratch=tmp_path / "s", ready_timeout_s=60) as server:
        assert server.get_json("/health") == {"ok": True} and server.alive()
    assert not server.alive()  # killed on leaving the block
    # a scratch folder too deep for a Unix socket's path (a long TMPDIR): the socket goes to a short folder
    with serve(app, "server:app", scratch=tmp_path / ("d" * 120), ready_timeout_s=60) as server:
        assert len(server.uds) <= 100 and server.get_json("/health") == {"ok": True}
    with pytest.raises(ServerFailed, match="dying now"):
        with serve(app, "server:app", scratch=tmp_path / "s2", ready_timeout_s=60) as server:
            with pytest.raises(Exception):
                server.request("GET", "/die")
            server.proc.wait(10)
    (app / "broken.py").write_text("raise RuntimeError('no app here')\n")
    with pytest.raises(ServerFailed, match="no app here"):
        with serve(app, "broken:app", scratch=tmp_path / "s3", ready_timeout_s=60):
            pass
