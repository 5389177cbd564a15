"""The engine reading: trace.yaml follows one completion request through the pinned vLLM release, step by step
(file, function, role). Every named function must exist in that file of the release (the course ships an index
of its request-path files: infracourse/kit/vllm_index.json, the stage each file belongs to), the steps must
start at the entry point and visit the scheduler, the KV-cache manager, model execution and output processing,
in the order a request meets them: the scheduler before the model runs, the KV-cache manager called from the
scheduling, output processing after the model ran. The roles are the learner's own words and are not graded.
No failure message shows the index (its files, stages of files the trace does not name, or definitions): the
trace is read from the source, not fitted to the judge's answers."""
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
            raise LabCheckFailed(
                f"trace.yaml step {i}: {file} is not one of the request-path files the course indexes for vLLM "
                f"{index['version']} (the entry point, the engine, the scheduler, the KV-cache manager, model "
                "execution and output processing). Give the path from the repository root (vllm/...) as it is at "
                "that release, of a file the request passes through")
        if resolve(entry["defs"], function) is None:
            raise LabCheckFailed(
                f"trace.yaml step {i}: {file} of vLLM {index['version']} defines no {function!r}. Name a function, "
                "a class or Class.method that the file defines at that release, as you read it there")
        stages.append(entry["stage"])
    if stages[0] != "entry":
        raise LabCheckFailed(f"trace.yaml's first step is in the {stages[0]} stage; a request enters through the "
                             "OpenAI-compatible server (vllm/entrypoints/...): start there")
    missing = [s for s in REQUIRED_STAGES if s not in stages]
    if missing:
        raise LabCheckFailed(f"trace.yaml's steps visit the stages {sorted(set(stages))} but not {missing}: follow "
                             "the request through the scheduler, the KV-cache manager, the model's execution and "
                             "the output processing back to the client")
    first = {stage: stages.index(stage) for stage in REQUIRED_STAGES}
    if first["model"] < first["scheduler"]:
        raise LabCheckFailed(
            f"trace.yaml step {first['model'] + 1} ({steps[first['model']]['function'].strip()}) runs the model "
            f"before any step reaches the scheduler (its first step is {first['scheduler'] + 1}): the model executes "
            "what the scheduler scheduled; list the steps in the order the request meets them")
    if not any(s == "cache" for s in stages[first["scheduler"]:]):
        raise LabCheckFailed(
            f"trace.yaml: no step after the scheduler's first (step {first['scheduler'] + 1}) is in the KV-cache "
            "manager; the scheduler asks it for the request's blocks (the prefix-cache lookup, then new slots) "
            "before the model runs: list the steps in the order the request meets them")
    if not any(s == "output" for s in stages[first["model"]:]):
        raise LabCheckFailed(
            f"trace.yaml: no output-processing step comes after the model's first (step {first['model'] + 1}); the "
            "sampled tokens go from the model back through output processing to the client: list the steps in "
            "the order the request meets them")
