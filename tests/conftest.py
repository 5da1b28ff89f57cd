"Shared test settings: one torch thread per process (2 cores shared with JVMs and browsers: more threads oversubscribe)."
import os
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch
torch.set_num_threads(1)
# CPython 3.11.7 can raise "SystemError: AST constructor recursion depth mismatch" when pytest rewrites a
# module late in a session (hypothesis' plugin imports hypothesis at the terminal summary, after the
# ScienceWorld JVM tests); importing it up front keeps that parse at collection time.
import hypothesis  # noqa: E402,F401
import json  # noqa: E402

import pytest  # noqa: E402

VERDICT = {"type": "object", "properties": {"success": {"enum": ["yes", "no"]}, "step": {"type": "integer", "minimum": 0, "maximum": 9}},
           "required": ["success", "step"], "additionalProperties": False}


def _verdict_ok(text: str) -> bool:
    try: obj = json.loads(text)
    except ValueError: return False
    return isinstance(obj, dict) and set(obj) == {"success", "step"} and obj["success"] in ("yes", "no") and obj["step"] in range(10)


@pytest.fixture
def verdict_schema():
    "A small JSON schema for constrained decoding, and the check that a reply is valid against it."
    return VERDICT, _verdict_ok
