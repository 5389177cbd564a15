"""Rank 0 alone writes the checkpoint; it loads and holds the final weights."""
from __future__ import annotations

import pytest
import torch

from infracourse.grader import LabCheckFailed
from week12_judging import params_difference

NAME = "checkpoint.pt"


@pytest.mark.check("rank0-checkpoint")
def test_rank0_checkpoint(launches):
    world = launches.two
    results = world.results("main")
    where = world.describe("main")
    folders = (str(world.checkpoint_dir), str(world.checkpoint_dir.resolve()))
    writers = [rank for rank, r in enumerate(results) if any(s.startswith(folders) for s in r["saves"])]
    path = world.checkpoint_dir / NAME
    if not path.is_file():
        raise LabCheckFailed(f"no {NAME} in checkpoint_dir after training ({where}); files there: "
                             f"{sorted(p.name for p in world.checkpoint_dir.iterdir())}. Rank 0 saves "
                             "{'model': model.module.state_dict(), 'step': steps} to checkpoint_dir/checkpoint.pt")
    if writers != [0]:
        raise LabCheckFailed(f"ranks {writers} called torch.save for the checkpoint ({where}); only rank 0 may "
                             "write it (the weights are identical on every rank; several writers of one file "
                             "race and waste the time of all but one). Guard the save with "
                             "`if dist.get_rank() == 0`, then dist.barrier()")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001  (what makes it unreadable is the finding)
        raise LabCheckFailed(f"{NAME} does not load with torch.load(weights_only=True): {type(exc).__name__}: "
                             f"{str(exc)[:300]}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise LabCheckFailed(f"{NAME} must be a dict with the weights under 'model'")
    final = {k: v.float() for k, v in results[0]["out"]["params"].items()}
    problem = params_difference(state["model"], final)
    if problem:
        raise LabCheckFailed(f"the checkpoint's weights are not the final weights rank 0 returned: {problem}")
