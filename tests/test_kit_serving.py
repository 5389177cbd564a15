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
