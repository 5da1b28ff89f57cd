"""The GPU extras resolve (pip's dry run against the registry): `.[unsloth]` (which pins trl <= 1.15 and datasets < 5,
so the package itself must not ask for more) and `.[vllm]` (pinned to the release line the backend is tested on)."""
import subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("extra", ["unsloth", "vllm"])
def test_extra_resolves(extra):
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-input", "-q",
                        "--report", "-", "-e", f".[{extra}]"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"pip cannot resolve .[{extra}]:\n{r.stderr[-3000:]}"
    import json
    names = {i["metadata"]["name"].lower() for i in json.loads(r.stdout)["install"]}
    assert extra in names and "labmod" in names, sorted(names)[:40]
