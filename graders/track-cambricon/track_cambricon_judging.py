"""The shared judging helpers of the track-cambricon graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
from __future__ import annotations

import json

from infracourse.grader import LabCheckFailed


BATCH = 2
# a second model the judge asks for: grouped KV heads and three layers (other ops, other shapes)
OTHER = dict(n_layer=3, n_kv_head=2, d_model=48, n_head=4, seq_len=32, vocab_size=96)


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
