"""The shared judging helpers of the track-cambricon graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

import json

from infracourse.grader import LabCheckFailed, require_own_implementation


BATCH = 2
# a second model the judge asks for: grouped KV heads and three layers (other ops, other shapes)
OTHER = dict(n_layer=3, n_kv_head=2, d_model=48, n_head=4, seq_len=32, vocab_size=96)


def learner_module(learner, name: str):
    """The learner's `name`.py, once the judge's reading finds it reaches nothing of kit.porting: mounted for run.py's
    stand-in device, it also holds the judge's reference run, op export, layer metrics and byte counts, and a
    reference.capture returning reference_run (or ops.traced_ops returning traced_ops; a learner's copy proved
    both) passed its check with no work of its own."""
    require_own_implementation(learner.root, f"{name}.py", ("infracourse.kit.porting",),
                               "write it yourself (read kit.porting, do not call it); run.py may use its stand-in "
                               "device (device_run, Perturbation)")
    return learner.module(name)


def read_raw(learner, name: str) -> dict:
    """raw/<name> from the learner's folder, as a JSON object; fails saying how to produce it."""
    path = learner.path(f"raw/{name}")
    if not path.exists():
        raise LabCheckFailed(f"raw/{name} is missing: run `python run.py --out raw` in your project folder (it "
                             f"writes {name}) and keep raw/ with your files")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LabCheckFailed(f"raw/{name} is not JSON ({str(exc)[:120]}): write it with json.dumps") from None
    if not isinstance(data, dict):
        raise LabCheckFailed(f"raw/{name} must hold a JSON object, as the handout shows")
    return data


def model_of(data: dict, name: str) -> dict:
    """The `model` config a raw file names ({} = the project's model), checked against kit.porting's keys."""
    from infracourse.kit.porting import CONFIG, model_config

    model = data.get("model", {})
    if not isinstance(model, dict) or not set(model) <= set(CONFIG):
        raise LabCheckFailed(f"raw/{name}: `model` must be a dict of GPT config keys among {sorted(CONFIG)} "
                             f"(got {str(model)[:120]})")
    try:
        model_config(model)
    except (TypeError, ValueError) as exc:
        raise LabCheckFailed(f"raw/{name}: `model` {model} is not a valid GPTConfig ({exc})") from None
    return model
