"""The shared judging helpers of the week17 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import subprocess
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
import psutil

import torch

from infracourse.grader import LabCheckFailed, WrongOutput, cpu_contention, require_own_implementation, serving
from infracourse.kit import batching
from infracourse.kit.load_matrix import LoadCell, load_matrix, run_cell
from infracourse.kit.loadgen import RequestSpec, compute_metrics, request_matrix


PERCENTILES = (50, 95, 99)
STARVE_SHORTS, STARVE_LONG_AT = 30, 8  # the starvation phase's short requests; where its long prompt is
FILL_WAIT_S = 5.0  # how long the starvation phase waits for its fillers to take every slot (one step, idle)
NEAR_TIE = 1e-4  # a token within this of the best logit counts as greedy (batched sums round differently)


# kit.static_server is mounted for the judge's baseline run (throughput-vs-static), and it is a whole server of the
# lab's API: a server.py that re-exported its app (a learner's copy proved it) passed greedy-outputs, blocks-freed
# and disconnect-frees with neither an engine nor a server of its own
STATIC_BASELINE = ("infracourse.kit.static_server",)


def require_own_server(learner_root) -> None:
    """server.py and engine.py, read before the server starts: neither may reach the course's static batcher."""
    for file in ("server.py", "engine.py"):
        require_own_implementation(learner_root, file, STATIC_BASELINE,
                                   "write the engine and the server yourself; kit.static_server is the baseline "
                                   "the judge times yours against")


@dataclass
class Served:
    seed: int
    cfg: batching.ServeConfig
    phases: dict[str, serving.Phase]
    log: str = ""

    def failed(self, what: str) -> LabCheckFailed:
        """A failure whose message adds what the server's log says went wrong, if anything."""
        return LabCheckFailed(teach_from_log(self.log, what))


def stand_in(cfg: batching.ServeConfig) -> dict:
    """What a figure measured through a floored runner is, for `record`: the floor's stand-in, on a CPU labelled
    source "cpu-stand-in" (the figures describe a device whose step costs the floor, not this machine)."""
    if cfg.step_floor_ms <= 0:
        return {"source": "device"} if cfg.device == "cuda" else {}
    label = (f"{cfg.step_floor_ms:g} ms step floor: ModelRunner sleeps each step up to it, standing in for a "
             "device whose step costs the same for 1 or 16 sequences")
    return {"label": label, **({"source": "cpu-stand-in"} if cfg.device == "cpu" else {})}


def teach(server: serving.Server, what: str) -> str:
    """`what`, plus the server's NotImplementedError or last traceback line when its log has one."""
    return teach_from_log(server.log_tail(20000), what)


def teach_from_log(log: str, what: str) -> str:
    """`what`, plus the NotImplementedErrors (each once) or the last error line of the server's log."""
    todo = list(dict.fromkeys(x.strip() for x in log.splitlines() if x.startswith("NotImplementedError")))
    if todo:
        return (f"{what}. Your server raised {'; '.join(todo[-3:])}: not written yet (see the handout)")
    errors = re.findall(r"^\w*(?:Error|Exception)\b.*$", log, re.MULTILINE)
    return f"{what}. Your server's log ends with: {errors[-1]}" if errors else what


def state(server: serving.Server) -> dict:
    """/debug/state, its fields type-checked: num_blocks, free_blocks, running, waiting (ints)."""
    s = server.get_json("/debug/state")
    missing = [k for k in ("num_blocks", "free_blocks", "running", "waiting")
               if not isinstance(s, dict) or type(s.get(k)) is not int]
    if missing:
        raise LabCheckFailed(f"GET /debug/state must answer a JSON object with integer num_blocks, free_blocks, "
                             f"running and waiting; {missing} missing or not integers in {s!r:.300}")
    return s


def wait_idle(server: serving.Server, free: int, within_s: float) -> tuple[dict, float]:
    """Poll /debug/state until nothing runs or waits and `free` blocks are free; (last state, seconds waited)."""
    started = time.perf_counter()
    while True:
        s = state(server)
        waited = time.perf_counter() - started
        if (s["running"] == 0 and s["waiting"] == 0 and s["free_blocks"] == free) or waited > within_s:
            return s, waited
        time.sleep(0.01)


def body(prompt: list[int], max_tokens: int, **extra) -> dict:
    return {"model": "kit-gpt", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **extra}


def tokens_of(text: str) -> list[int]:
    """A streamed text back to its ids: the vocabulary is 128 ASCII characters, one per token."""
    return [ord(c) for c in text]


@torch.no_grad()
def first_non_greedy(model, prompt: list[int], tokens: list[int]) -> int | None:
    """The first position where `tokens` leaves greedy decoding (teacher-forced: one forward over prompt +
    tokens, each token must be the argmax, or within NEAR_TIE of it, at the position before it); None if none."""
    if not tokens or any(not 0 <= t < model.cfg.vocab_size for t in tokens):
        return 0
    logits = model(torch.tensor([prompt + tokens[:-1]]))[0, len(prompt) - 1:].float()
    chosen = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    bad = (chosen < logits.max(-1).values - NEAR_TIE).nonzero()
    return int(bad[0]) if len(bad) else None


def check_outputs(model, specs: list[RequestSpec], records, what: str) -> None:
    """Every successful record's text is max_tokens greedy tokens of its prompt (LabCheckFailed otherwise)."""
    for i, (spec, rec) in enumerate(zip(specs, records)):
        if not rec.success:
            continue
        tokens = tokens_of(rec.text)
        if len(tokens) != spec.max_tokens:
            raise LabCheckFailed(f"{what}: request {i} (prompt of {len(spec.prompt_ids)} tokens) streamed "
                                 f"{len(tokens)} token(s), max_tokens was {spec.max_tokens}: one content chunk per "
                                 "token, text = chr(token id), until max_tokens (ignore_eos)")
        bad = first_non_greedy(model, spec.prompt_ids, tokens)
        if bad is not None:
            expected = first_non_greedy_expected(model, spec.prompt_ids, tokens, bad)
            raise LabCheckFailed(
                f"{what}: request {i} (prompt of {len(spec.prompt_ids)} tokens, {spec.max_tokens} new) differs from "
                f"sequential greedy generation (kit.generate) at new token {bad}: got {tokens[bad]}, greedy gives "
                f"{expected}. A token computed with the wrong keys (another sequence's blocks, a block freed and "
                "reused, a preempted sequence recomputed without its generated tokens) or at the wrong position")


@torch.no_grad()
def first_non_greedy_expected(model, prompt, tokens, position) -> int:
    return int(model(torch.tensor([prompt + tokens[:position]]))[0, -1].float().argmax())


def device_memory_mb(server: serving.Server) -> float | None:
    """GPU memory the server's processes hold, MiB, as the driver reports it (nvidia-smi, after the load: the
    caching allocator keeps its peak); None on a CPU run or where the driver lists no process of the server."""
    try:
        pids = {server.proc.pid, *(c.pid for c in psutil.Process(server.proc.pid).children(recursive=True))}
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError, psutil.NoSuchProcess):
        return None
    used = [float(mb) for pid, mb in (line.split(",") for line in out.splitlines() if line.count(",") == 1)
            if pid.strip().isdigit() and int(pid) in pids]
    return sum(used) if used else None


def peak_rss_mb(server: serving.Server) -> float:
    """The largest peak resident set (VmHWM) among the server's processes, MiB: the uvicorn Python process."""
    peak = 0
    try:
        procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            status = Path(f"/proc/{p.pid}/status").read_text()
        except OSError:
            continue
        m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        if m:
            peak = max(peak, int(m.group(1)))
    return peak / 1024


# --- the phases ------------------------------------------------------------------------------------------------

def phase_load(server: serving.Server, seed: int) -> dict:
    specs = batching.bench_specs(seed)
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            try:
                samples.append(state(server))
            except Exception:  # noqa: BLE001 - a bad answer is judged after the run, from the polls that worked
                pass
            time.sleep(0.05)

    poller = threading.Thread(target=sample, daemon=True)
    poller.start()
    try:
        records, duration = server.load(specs, concurrency=batching.BENCH_CONCURRENCY, timeout_s=60.0)
    finally:
        stop.set()
        poller.join()
    server.require_alive("during the load point")
    idle, waited = wait_idle(server, batching.bench_config().num_blocks, 2.0)
    metrics = compute_metrics(records, duration, percentiles=PERCENTILES, goodput_slo_ms=batching.BENCH_SLO_MS)
    metrics["decoding_at_once"] = decoding_at_once(records, duration)
    return {"specs": specs, "records": records, "metrics": metrics, "samples": samples,
            "idle": idle, "idle_after_s": waited, "rss_mb": peak_rss_mb(server), "contention": cpu_contention(),
            "device_mb": device_memory_mb(server)}


def phase_starvation(server: serving.Server, seed: int, cfg: batching.ServeConfig) -> dict:
    """Fill every slot and block with long-running requests, queue short prompts and one long prompt behind
    them, and see who is admitted first when the slots come free."""
    # one prompt token and enough new ones that the fillers' sequences end up holding every block of the pool
    filler_tokens = cfg.num_blocks * cfg.block_size // cfg.max_num_seqs
    fillers = request_matrix([1], [filler_tokens - 1], cfg.max_num_seqs, vocab_size=128, seed=seed + 1)
    shorts = request_matrix([8], [8], STARVE_SHORTS, vocab_size=128, seed=seed + 2)
    long = request_matrix([100], [8], 1, vocab_size=128, seed=seed + 3)[0]
    specs = shorts[:STARVE_LONG_AT] + [long] + shorts[STARVE_LONG_AT:]
    done = {}
    filling = threading.Thread(target=lambda: done.update(records=server.load(fillers, timeout_s=30.0)[0]),
                               daemon=True)
    filling.start()
    began = time.perf_counter()
    while state(server)["running"] < cfg.max_num_seqs and time.perf_counter() - began < FILL_WAIT_S:
        time.sleep(0.005)
    full = state(server)
    records, _ = server.load(specs, timeout_s=30.0)  # all at once, into the queue
    filling.join(30)
    return {"specs": specs, "records": records, "long_index": STARVE_LONG_AT, "full": full,
            "fillers": done.get("records")}


def phase_disconnect(server: serving.Server, seed: int, floor_s: float) -> dict:
    before = wait_idle(server, batching.bench_config().num_blocks, 2.0)[0]
    prompt = request_matrix([8], [1], 1, vocab_size=128, seed=seed + 3)[0].prompt_ids
    max_tokens = 120
    stream = server.stream(body(prompt, max_tokens))
    times = []
    try:
        if stream.status != 200:
            raise LabCheckFailed(f"the disconnect probe's request (prompt of 8 tokens, max_tokens {max_tokens}) was "
                                 f"answered HTTP {stream.status}, expected 200 and a stream")
        for t, event in stream.events():
            if isinstance(event, dict) and (event.get("choices") or [{}])[0].get("text"):
                times.append(t)
                if len(times) == 2:
                    break
        during = state(server)
    finally:
        stream.close()
    # half the least time the rest of the generation needs: a step lasts at least the runner's floor (CPU), or
    # what this stream's second token took (GPU)
    itl = max(floor_s, (times[1] - times[0]) if len(times) == 2 else 0.0)
    window = max(0.1, 0.5 * (max_tokens - 2) * itl)
    after, _ = wait_idle(server, before["free_blocks"], window)
    # the server must still serve: a new request completes, correct
    spec = request_matrix([8], [6], 1, vocab_size=128, seed=seed + 4)[0]
    records, _ = server.load([spec], timeout_s=20.0)
    return {"before": before, "during": during, "after": after, "chunks": len(times), "window_s": window,
            "next": (spec, records[0])}


def deadline_stream(server: serving.Server, prompt: list[int], max_tokens: int, timeout: float) -> dict:
    """One request with timeout_s, read to its end: HTTP status, content chunks, [DONE] or not, seconds from
    its send to its end (the judge's clock)."""
    stream = server.stream(body(prompt, max_tokens, timeout_s=timeout))
    content, done = 0, False
    try:
        if stream.status == 200:
            for _, event in stream.events():
                if event == "[DONE]":
                    done = True
                    break
                if isinstance(event, dict) and (event.get("choices") or [{}])[0].get("text"):
                    content += 1
        ended = time.perf_counter() - stream.sent
    finally:
        stream.close()
    return {"timeout_s": timeout, "status": stream.status, "content": content, "done": done, "ended_s": ended,
            "max_tokens": max_tokens}


def phase_timeout(server: serving.Server, seed: int, itl_s: float) -> dict:
    before = wait_idle(server, batching.bench_config().num_blocks, 2.0)[0]
    prompt = request_matrix([8], [1], 1, vocab_size=128, seed=seed + 5)[0].prompt_ids
    max_tokens = 120
    timeout = min(0.3, max(0.02, 0.3 * max_tokens * itl_s))  # well under the generation's own time
    seen = deadline_stream(server, prompt, max_tokens, timeout)
    after, waited = wait_idle(server, before["free_blocks"], 1.0)
    return {**seen, "before": before, "after": after}


# The pressure phase: the scheduler in the conditions its rules exist for. A pacer runs; then FIRST requests of
# FIRST_PROMPT + FIRST_NEW tokens arrive at once: two of their prompts and the pacer's decode token are more than
# a step's budget (max_num_batched_tokens 128), and their sequences need more blocks than the pool holds (16 x 13
# of 96), so the reference must preempt, again and again as they grow. LATE requests and one with a deadline
# arrive once every FIRST request has: first come first served, they wait behind every FIRST one, preempted ones
# included, and the deadline (counted from its arrival) passes long before it could be admitted.
JOURNAL = "steps.jsonl"  # ModelRunner's step journal, in the server's working folder
FIRST, FIRST_PROMPT, FIRST_NEW, LATE, PRESSURE_DEADLINE_S = 16, 64, 40, 4, 0.25
DEADLINE_SLACK_S = 0.5  # how late past its deadline a queued request may end (a loaded machine's event loop)
PACER_NEW = 60


def pressure_specs(seed: int) -> dict:
    """The phase's requests; prompt[0] tells them apart in the runner's journal (1 the pacer, then 2, 3, ...)."""
    pacer = request_matrix([1], [PACER_NEW], 1, vocab_size=128, seed=seed + 7)
    first = request_matrix([FIRST_PROMPT], [FIRST_NEW], FIRST, vocab_size=128, seed=seed + 8)
    late = request_matrix([8], [8], LATE + 1, vocab_size=128, seed=seed + 9)
    specs = [*pacer, *first, *late]
    for i, spec in enumerate(specs):
        spec.prompt_ids[0] = i + 1
    return {"pacer": specs[0], "first": specs[1:1 + FIRST], "late": specs[1 + FIRST:-1], "deadline": specs[-1]}


def journal_length(path: Path) -> int:
    return len(read_journal(path))


def read_journal(path: Path) -> list:
    """The steps the course's ModelRunner journalled (one JSON list of [start, tokens, block_table] per step);
    a last line cut mid-write is left out."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    steps = []
    for line in lines:
        try:
            steps.append(json.loads(line))
        except ValueError:
            break
    return steps


def phase_pressure(server: serving.Server, seed: int, cfg: batching.ServeConfig, journal: Path) -> dict:
    wait_idle(server, cfg.num_blocks, 2.0)
    specs, out = pressure_specs(seed), {}
    begin = journal_length(journal)

    def run(name, batch, **kwargs):
        out[name] = server.load(batch, timeout_s=60.0, **kwargs)[0]

    threads = [threading.Thread(target=run, args=("pacer", [specs["pacer"]]), daemon=True)]
    threads[0].start()
    began = time.perf_counter()
    while state(server)["running"] < 1 and time.perf_counter() - began < 2.0:
        time.sleep(0.005)
    threads.append(threading.Thread(target=run, args=("first", specs["first"]), daemon=True))
    threads[-1].start()
    while time.perf_counter() - began < 4.0:  # every FIRST request arrived: running or waiting
        s = state(server)
        if s["running"] + s["waiting"] >= FIRST + 1:
            break
        time.sleep(0.005)
    ahead = state(server)
    threads.append(threading.Thread(target=run, args=("late", specs["late"]), daemon=True))
    threads[-1].start()
    deadline = deadline_stream(server, specs["deadline"].prompt_ids, specs["deadline"].max_tokens,
                               PRESSURE_DEADLINE_S)
    for t in threads:
        t.join(60)
    wait_idle(server, cfg.num_blocks, 2.0)
    return {**specs, "records": out, "ahead": ahead, "deadline_seen": deadline,
            "steps": read_journal(journal)[begin:], "begin": begin, "journal": journal}


def residencies(steps: list, specs: list[RequestSpec]) -> dict[int, list[list[int]]]:
    """Per request (index into specs), the [first, last] step of each stay in the running batch, from the
    journal: a stay opens with a piece at position 0 (its prompt[0] names the request) and lasts while pieces
    use the block table it began with (its first block)."""
    ids = {spec.prompt_ids[0]: i for i, spec in enumerate(specs)}
    stays: dict[int, list[list[int]]] = {}
    owner: dict[int, list[int]] = {}
    for step, pieces in enumerate(steps):
        for start, tokens, table in pieces:
            if not table or not tokens:
                continue
            if start == 0:
                if tokens[0] in ids:
                    stay = [step, step]
                    stays.setdefault(ids[tokens[0]], []).append(stay)
                    owner[table[0]] = stay
                else:
                    owner.pop(table[0], None)
            elif table[0] in owner:
                owner[table[0]][1] = step
    return stays


def phase_burst(server: serving.Server, seed: int, cfg: batching.ServeConfig) -> dict:
    """All at once, each on its own raw stream (a thread each): status, seconds to the status line, text."""
    n = cfg.max_num_seqs + cfg.max_waiting + 32
    specs = request_matrix([8], [16], n, vocab_size=128, seed=seed + 6)
    answers: list[dict | None] = [None] * n
    samples, start = [], threading.Barrier(n + 1)

    def one(i: int) -> None:
        start.wait()
        try:
            stream = server.stream(body(specs[i].prompt_ids, specs[i].max_tokens), timeout_s=60.0)
        except OSError as exc:
            answers[i] = {"status": 0, "status_s": None, "text": "", "done": False, "error": str(exc)}
            return
        status_s, text, done = time.perf_counter() - stream.sent, [], False
        try:
            if stream.status == 200:
                for _, event in stream.events():
                    if event == "[DONE]":
                        done = True
                        break
                    if isinstance(event, dict):
                        text.append((event.get("choices") or [{}])[0].get("text") or "")
        finally:
            stream.close()
        answers[i] = {"status": stream.status, "status_s": status_s, "text": "".join(text), "done": done,
                      "error": ""}

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    while any(t.is_alive() for t in threads) and time.perf_counter() - began < 90:
        samples.append(state(server))
        time.sleep(0.02)
    return {"specs": specs, "answers": answers, "samples": samples, "n": n}


keep_phase = functools.partial(serving.run_phase, teach=teach, who="server")  # one phase of the grade, into phases


def decoding_at_once(records, duration_s: float) -> float:
    """Little's law on the client's clock: the mean number of requests between their first and last token over
    the run, i.e. the sequences decoding at once, whatever each step cost."""
    return sum(r.chunk_times[-1] - r.chunk_times[0] for r in records if r.success and r.chunk_times) / duration_s


def load_point(server: serving.Server, seed: int, who: str) -> dict:
    """The load point through `server`, the judge's clock: kit.loadgen metrics (output_throughput: output tokens
    of successful requests per second; ttft_ms percentiles)."""
    records, duration = server.load(batching.bench_specs(seed), concurrency=batching.BENCH_CONCURRENCY,
                                    timeout_s=60.0)
    metrics = compute_metrics(records, duration)
    metrics["decoding_at_once"] = decoding_at_once(records, duration)
    if metrics["failed"]:
        message = f"{metrics['failed']} requests failed ({[r.error for r in records if not r.success][:2]})"
        if who == "static":
            raise RuntimeError(f"the course's static-batching baseline: {message}; a course bug, please report it")
        raise LabCheckFailed(f"the load point, measured again: {message}")
    return metrics


def median(values):
    return statistics.median(values) if values else 0.0


# The load matrix (bench.py writes it into matrix/ with kit.load_matrix.run_matrix): the handout's cells, and the
# ones the judge runs again through the learner's server: the heaviest closed-loop cell, its one-user control
# (the throughput 4 users buy over 1, a ratio in which the machine's load cancels) and the bursty open-loop cell
# of the same lengths (a queue builds in its clumps)
MATRIX_DIR = "matrix"
MATRIX = load_matrix(input_lens=[16, 64], output_lens=[4, 16], concurrencies=[1, 4], rates=[32.0],
                     burstiness=[1.0, 0.25], requests=8)
HEAVIEST = LoadCell(64, 16, 8, concurrency=4)
ONE_USER = LoadCell(64, 16, 8, concurrency=1)
BURSTY = LoadCell(64, 16, 8, rate=32.0, burstiness=0.25)
RERUN = (HEAVIEST, ONE_USER, BURSTY)


def matrix_seeds(summary_path: Path) -> dict[str, int]:
    """Each re-run cell's seed as the learner's matrix.json gives it (run_matrix: seed + k), so the judge sends
    the same prompts on the same arrival clock; the handout's (cell k of MATRIX: k) where it gives none."""
    seeds = {cell.name: k for k, cell in enumerate(MATRIX)}
    try:
        rows = json.loads(summary_path.read_text(encoding="utf-8"))["cells"]
        stated = {row["file"].removesuffix(".json"): row["seed"] for row in rows}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return seeds
    return {name: stated[name] if type(stated.get(name)) is int and stated[name] >= 0 else seed
            for name, seed in seeds.items()}


def phase_matrix(server: serving.Server, seeds: dict[str, int]) -> dict:
    """The re-run cells through the learner's server, the judge's clock, each with the learner's seed."""
    wait_idle(server, batching.bench_config().num_blocks, 2.0)
    metrics = {}
    for cell in RERUN:
        records, duration = run_cell(cell, seed=seeds[cell.name], vocab_size=batching.SERVE_GPT.vocab_size,
                                     uds=server.uds, base_url=server.base_url, timeout_s=60.0)
        server.require_alive(f"during the load matrix's cell {cell.name}")
        metrics[cell.name] = compute_metrics(records, duration, percentiles=PERCENTILES,
                                             goodput_slo_ms=batching.BENCH_SLO_MS)
    return {"metrics": metrics, "contention": cpu_contention()}


# On the GPU (test_gpu_serving.py): a Llama checkpoint on the device, no step floor ------------------------------
# 4 layers of a Llama-3-8B-shaped block (0.87 B parameters, 1.75 GB in bf16), vocabulary 128 so that the server's
# one character per token still holds: a decode step reads every weight once, as a serving model's does, and the
# checkpoint is written, copied and loaded in seconds
GPU_CHECKPOINT = {"layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 128, "intermediate": 14336,
                  "max_positions": 128}
MEMORY = "memory.json"     # ModelRunner's memory figures, in the server's working folder
GPU_NEAR_TIE = 8e-2        # bf16: a token within this of the best logit counts as greedy (batched sums round apart)
GPU_CHECKED = 8            # the load point's requests whose tokens the judge recomputes
TTFT_SLACK = 1.25          # P99 TTFT may exceed static batching's by this factor
LIVE_SERVERS: list[serving.Server] = []  # the grade's floor servers of the learner, paused while the GPU is timed


def gpu_config(checkpoint: Path) -> batching.ServeConfig:
    """The load point's limits with the judge's checkpoint on the device and no floor: the step costs what the
    device takes."""
    return dataclasses.replace(batching.bench_config("cuda"), step_floor_ms=0.0, model=str(checkpoint),
                               memory_report=MEMORY, step_journal=JOURNAL)


@contextlib.contextmanager
def paused(servers: list[serving.Server]):
    """Every process of `servers` stopped (SIGSTOP) for the block: nothing of the learner's but the server under
    test may use the device while the judge times it or the baseline."""
    procs = []
    for server in servers:
        try:
            tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            try:
                p.suspend()
                procs.append(p)
            except psutil.NoSuchProcess:
                pass
    try:
        yield
    finally:
        for p in reversed(procs):
            try:
                p.resume()
            except psutil.NoSuchProcess:
                pass


def read_memory(folder: Path) -> dict | None:
    try:
        figures = json.loads((folder / MEMORY).read_text())
    except (OSError, ValueError):
        return None
    return figures if isinstance(figures, dict) else None


def check_device_memory(figures: dict | None, *, formula: int, weights: int, device_delta: int, what: str) -> None:
    """The memory figures of the course's ModelRunner in the server's process (`figures`, its memory report)
    against the judge's: `formula` = kv_pool_bytes at the model's dtype, `weights` the checkpoint's bytes,
    `device_delta` the device memory the judge saw taken while the server was up (torch.cuda.mem_get_info).
    A figure of host memory (source "cpu-stand-in": tensors in host memory) is not device memory and fails.
    WrongOutput: a wrong figure is not a slow one, and is not measured again."""
    if figures is None:
        raise WrongOutput(f"{what}: the course's ModelRunner wrote no memory figures ({MEMORY}, memory_report): "
                          "build the engine's runner with ModelRunner(ServeConfig.from_env()), unchanged")
    if figures.get("source") != "device":
        raise WrongOutput(f"{what}: the KV pool's figures come from {figures.get('source')!r}, not the device: the "
                          "model and its pool are in host memory. Build the runner with the configuration the "
                          "server was started with (device cuda): on a GPU the pool's bytes are the device "
                          "allocator's (torch.cuda.memory_allocated), not sizes of host tensors")
    numbers = {k: figures.get(k) for k in ("kv_pool_bytes", "weights_bytes", "max_allocated")}
    if not all(type(v) is int for v in numbers.values()):
        raise WrongOutput(f"{what}: the runner's memory figures are not the allocator's byte counts: {numbers}")
    pool, peak = numbers["kv_pool_bytes"], numbers["max_allocated"]
    if not formula <= pool <= formula + 2 * 512:  # K and V, each rounded up to 512 bytes by the allocator
        raise WrongOutput(f"{what}: the device's allocator gave the KV pool {pool} bytes; kv_pool_bytes at the "
                             f"model's dtype gives {formula}: the pool is not the model's dtype or not this pool")
    if numbers["weights_bytes"] < weights or peak < weights + formula:
        raise WrongOutput(f"{what}: the device held {numbers['weights_bytes']} bytes before the pool and at most "
                             f"{peak}, less than the checkpoint's {weights} bytes of weights and the pool's "
                             f"{formula}: the model is not on the device")
    if device_delta < 0.9 * (weights + pool) - 64 * 2**20:
        raise WrongOutput(f"{what}: the runner says the device holds {weights + pool} bytes of weights and pool, but "
                             f"the device showed {device_delta} bytes more in use while the server was up "
                          "(torch.cuda.mem_get_info, read by the judge): the figures are not the device's")


def tokens_through_runner(steps: list, records) -> str | None:
    """None when the runner's journal (`steps`, the load's) holds a piece for every token the records streamed:
    each piece gives at most one token (its last position's), so fewer pieces than tokens means tokens computed
    outside the course's ModelRunner.step; otherwise what is wrong."""
    pieces = sum(len(step) for step in steps)
    streamed = sum(len(r.chunk_times) for r in records if r.success)
    if pieces < streamed:
        return (f"your server streamed {streamed} tokens, but the course's ModelRunner computed only {pieces} pieces "
                "(one token each at most): every token must come from runner.step(...)")
    return None


def compare_with_static(mine: dict, static: dict, need: float) -> str | None:
    """None when the load point's output throughput through the learner's server is at least `need` x static
    batching's at no worse P99 TTFT (TTFT_SLACK); otherwise what is wrong (kit.loadgen metrics, judge's clock)."""
    ours, theirs = mine["output_throughput"], static["output_throughput"]
    if mine["ttft_ms"]["p99"] > TTFT_SLACK * static["ttft_ms"]["p99"]:
        return (f"P99 time to first token: yours {mine['ttft_ms']['p99']:.0f} ms, static batching's "
                f"{static['ttft_ms']['p99']:.0f} ms: admit waiting requests into the running batch at every step")
    if ours < need * theirs:
        return (f"output throughput: yours {ours:.0f} tok/s, the course's static batching {theirs:.0f} tok/s on the same "
                f"device: {ours / theirs:.2f}x, at least {need:g}x expected. Admit waiting requests at every step, "
                "retire finished ones at once, keep up to max_num_seqs running, and keep Python work per step small: "
                "with no floor, time your engine loop spends between steps is time the device idles")
    return None
