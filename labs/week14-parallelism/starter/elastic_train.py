"""Data-parallel training that survives a killed rank: torchrun (--max-restarts) starts the world again, and
every rank resumes from the newest complete sharded checkpoint (torch.distributed.checkpoint).

Each rank appends one JSON line per finished step to log_dir/rank{r}.jsonl; the return value of the attempt
that finishes reports where it resumed and when each phase of the recovery ended (time.time(), seconds).
"""
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from infracourse.kit.parallel_reference import ELASTIC, elastic_batch, elastic_loss, elastic_params


def train(checkpoint_dir, log_dir, seed, steps, save_every, step_seconds):
    """See the README for what to return."""
    raise NotImplementedError("TODO: load the newest complete checkpoint, train, log, save")
