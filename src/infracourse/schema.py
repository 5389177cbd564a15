"""The JSON Schema of every course file (`infracourse syllabus --schema`): the syllabus, a lab.yaml, a track and
a drill file, each from the pydantic model that loads it (infracourse.syllabus, infracourse.drills.content)."""
from __future__ import annotations

from infracourse.drills.content import json_schema as drill_schema
from infracourse.syllabus import Lab, Syllabus, Track


def json_schema() -> dict:
    return {"syllabus.yaml": Syllabus.model_json_schema(), "lab.yaml": Lab.model_json_schema(),
            "tracks/*.yaml": Track.model_json_schema(), "drills/*.yaml": drill_schema()}
