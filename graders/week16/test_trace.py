"""The engine reading: trace.yaml follows one completion request through the pinned vLLM release, step by step
(file, function, role). Every named function must exist in that file of the release (the course ships an index
of its request-path files: infracourse/kit/vllm_index.json), and the steps must start at the entry point and
visit the scheduler, the KV-cache manager, model execution and output processing. The roles are the learner's
own words and are not graded."""
import difflib

import pytest
import yaml

from infracourse.grader import LabCheckFailed
from infracourse.kit.paged_reference import REQUIRED_STAGES, vllm_index


def resolve(defs: list[str], name: str) -> str | None:
    """`name` as the index spells it: 'function', 'Class' or 'Class.method'; a bare method name is accepted when
    exactly one class of the file defines it."""
    if name in defs:
        return name
    matches = [d for d in defs if d.endswith("." + name)]
    return matches[0] if len(matches) == 1 else None


@pytest.mark.check("engine-trace")
def test_trace_names_real_files_and_functions(learner):
    index = vllm_index()
    path = learner.path("trace.yaml")
    if not path.exists():
        raise LabCheckFailed("trace.yaml is missing: write the request's path as the template shows")
    try:
        trace = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise LabCheckFailed(f"trace.yaml is not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(trace, dict) or str(trace.get("version")) != index["version"]:
        raise LabCheckFailed(f"trace.yaml must name the release it was read from, `version: {index['version']}` "
                             f"(vLLM commit {index['commit']}, the one the course indexes); got "
                             f"{trace.get('version') if isinstance(trace, dict) else trace!r:.80}")
    steps = trace.get("steps")
    if not isinstance(steps, list) or len(steps) < len(REQUIRED_STAGES):
        raise LabCheckFailed(f"trace.yaml's `steps` must list at least {len(REQUIRED_STAGES)} steps, each "
                             "{file, function, role}, in the order the request meets them")
    stages = []
    for i, step in enumerate(steps, 1):
        if not isinstance(step, dict) or not all(isinstance(step.get(k), str) and step[k].strip()
                                                 for k in ("file", "function", "role")):
            raise LabCheckFailed(f"trace.yaml step {i} must give `file`, `function` and a one-line `role`, got "
                                 f"{step!r:.200}")
        file, function = step["file"].strip(), step["function"].strip()
        entry = index["files"].get(file)
        if entry is None:
            near = [f for f in index["files"] if f.rsplit("/", 1)[-1] == file.rsplit("/", 1)[-1]]
            raise LabCheckFailed(
                f"trace.yaml step {i}: {file} is not one of the request-path files the course indexes for vLLM "
                f"{index['version']}{f' (did you mean {near[0]}?)' if near else ''}. Paths start at the repository "
                f"root (vllm/...); the indexed files are: {', '.join(sorted(index['files']))}")
        if resolve(entry["defs"], function) is None:
            close = difflib.get_close_matches(function, entry["defs"], n=4, cutoff=0.6)
            raise LabCheckFailed(
                f"trace.yaml step {i}: {file} of vLLM {index['version']} defines no {function!r}"
                f"{f' (close: {close})' if close else ''}. Name a function, a class or Class.method that the "
                "file defines at that release, as you read it there")
        stages.append(entry["stage"])
    if stages[0] != "entry":
        raise LabCheckFailed(f"trace.yaml's first step is in the {stages[0]} stage; a request enters through the "
                             "OpenAI-compatible server (vllm/entrypoints/...): start there")
    missing = [s for s in REQUIRED_STAGES if s not in stages]
    if missing:
        raise LabCheckFailed(f"trace.yaml's steps visit the stages {sorted(set(stages))} but not {missing}: follow "
                             "the request through the scheduler, the KV-cache manager, the model's execution and "
                             "the output processing back to the client")
