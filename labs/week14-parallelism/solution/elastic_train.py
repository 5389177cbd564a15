"""Data-parallel training that survives a killed rank: torchrun (--max-restarts) starts the world again, and
every rank resumes from the newest complete sharded checkpoint (torch.distributed.checkpoint).

Each rank appends one JSON line per finished step to log_dir/rank{r}.jsonl, and one to
log_dir/rank{r}.events.jsonl when it learns that the world failed (a collective raised, or torchrun's SIGTERM
came); the return value of the attempt that finishes reports where it resumed and when each phase of the
recovery ended (time.time(), seconds): detection, restart, reload, catch-up.
"""
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from infracourse.kit.parallel_reference import ELASTIC, elastic_batch, elastic_loss, elastic_params

MARKER = "COMPLETE"  # written after every rank's shards and DCP's .metadata: the checkpoint is whole


def complete_checkpoints(checkpoint_dir):
    """(step, folder) of every whole checkpoint, oldest first; a folder without the marker was cut short."""
    found = []
    for folder in Path(checkpoint_dir).glob("step_*"):
        if (folder / MARKER).is_file() and (folder / ".metadata").is_file():
            found.append((int(folder.name.split("_")[1]), folder))
    return sorted(found)


def save(state, checkpoint_dir, step):
    folder = Path(checkpoint_dir) / f"step_{step:06d}"
    dcp.save(state, checkpoint_id=folder)   # every rank writes its shard; rank 0 writes .metadata last
    dist.barrier()                          # every rank has returned from the save
    if dist.get_rank() == 0:
        with open(folder / (MARKER + ".tmp"), "w") as f:
            f.write(str(step))
            f.flush()
            os.fsync(f.fileno())
        os.replace(folder / (MARKER + ".tmp"), folder / MARKER)


def previous_attempt_end(log_path):
    """(last step, its time) the previous attempts logged, from this rank's log; (0, None) on a first start."""
    last = (0, None)
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            entry = json.loads(line)
            last = max(last, (entry["step"], entry["time"]), key=lambda x: x[0])
    return last


def failure_noticed(events_path, restart):
    """When the given attempt first learnt of the failure (its events file), or None."""
    times = []
    if events_path.exists():
        for line in events_path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("restart") == restart and entry.get("event") == "failure":
                times.append(entry["time"])
    return min(times, default=None)


def train(checkpoint_dir, log_dir, seed, steps, save_every, step_seconds):
    restarted_at = time.time()  # torchrun started this rank and the process group is formed
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log_path = Path(log_dir) / f"rank{rank}.jsonl"
    events_path = Path(log_dir) / f"rank{rank}.events.jsonl"
    reached, last_alive_at = previous_attempt_end(log_path)
    detected_at = failure_noticed(events_path, restart - 1) if restart else None

    def note_failure(cause):
        with open(events_path, "a") as events:
            events.write(json.dumps({"restart": restart, "event": "failure", "cause": cause,
                                     "time": time.time()}) + "\n")
            events.flush()

    def on_sigterm(signum, frame):  # torchrun tears the world down: the surviving ranks get SIGTERM
        note_failure("SIGTERM from torchrun")
        os._exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)

    params = elastic_params(seed)
    state = {"w1": params["w1"], "w2": params["w2"], "momentum_w1": torch.zeros_like(params["w1"]),
             "momentum_w2": torch.zeros_like(params["w2"]), "step": torch.tensor(0)}
    whole = complete_checkpoints(checkpoint_dir)
    if whole:
        dcp.load(state, checkpoint_id=whole[-1][1])  # in place, into the tensors above
    resumed_from = int(state["step"])
    loaded_at = time.time()
    caught_up_at = loaded_at if reached <= resumed_from else None

    try:
        with open(log_path, "a") as log:
            for step in range(resumed_from + 1, steps + 1):
                w = {k: state[k].requires_grad_() for k in ("w1", "w2")}
                grads = torch.autograd.grad(elastic_loss(w, *elastic_batch(seed, step, rank)), [w["w1"], w["w2"]])
                with torch.no_grad():
                    for name, grad in zip(("w1", "w2"), grads):
                        dist.all_reduce(grad)
                        grad /= world
                        state[f"momentum_{name}"].mul_(ELASTIC["momentum"]).add_(grad)
                        state[name] = state[name].detach().add_(state[f"momentum_{name}"], alpha=-ELASTIC["lr"])
                state["step"] = torch.tensor(step)
                time.sleep(step_seconds)  # stands for the compute of a real step
                log.write(json.dumps({"restart": restart, "step": step, "time": time.time()}) + "\n")
                log.flush()
                if step == reached:
                    caught_up_at = time.time()
                if step % save_every == 0:
                    save(state, checkpoint_dir, step)
    except Exception as exc:  # a collective with a dead peer raises: this rank has detected the failure
        note_failure(type(exc).__name__)
        raise
    return {"params": {"w1": state["w1"].detach(), "w2": state["w2"].detach()}, "restart": restart,
            "resumed_from": resumed_from, "lost_steps": max(reached - resumed_from, 0),
            "last_alive_at": last_alive_at, "detected_at": detected_at, "restarted_at": restarted_at,
            "loaded_at": loaded_at, "caught_up_at": caught_up_at, "finished_at": time.time()}
