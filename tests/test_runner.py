"labmod run / sweep / report end to end on a small real notebook, and the errors users see."
import json, subprocess, sys
from pathlib import Path
import nbformat, pytest

LABMOD = [sys.executable, "-m", "labmod.lab.cli"]

def make_notebook(path: Path, body: str):
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell("quick = True\nseed = 0\nscale = 1.0\nfail = False"); p.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# tiny experiment"), p, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path); return path

BODY = """
from labmod.lab.experiment import start_run
import random
run = start_run("tiny", dict(seed=seed, scale=scale))
rng = random.Random(seed)
for i in range(5): run.log(i, reward=scale * rng.random())
if fail: raise RuntimeError("asked to fail")
run.final(success=scale * (0.5 + 0.1 * seed))
print("done")
"""

@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("LABMOD_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("LABMOD_REPORTS_DIR", str(tmp_path / "reports"))
    return tmp_path

def cli(*args):
    return subprocess.run([*LABMOD, *args], capture_output=True, text=True, timeout=600)

def test_run_writes_run_dir_and_report(env):
    nb = make_notebook(env / "tiny.ipynb", BODY)
    r = cli("run", str(nb), "-p", "seed", "2", "--name", "r1")
    assert r.returncode == 0, r.stderr
    run_dir = env / "runs" / "tiny" / "r1"
    assert (run_dir / "notebook.ipynb").exists() and json.loads((run_dir / "params.json").read_text())["seed"] == 2
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 5
    html = (env / "reports" / "tiny" / "r1.html").read_text()
    assert "status-ok" in html and "&quot;seed&quot;: 2" in html and "machine" in html and "commit" in html
    assert "from labmod.lab.experiment import start_run" not in html  # inputs hidden
    assert 'href="tiny/r1.html"' in (env / "reports" / "index.html").read_text()
    assert "report: " in r.stdout

def test_failing_notebook_renders_failed_report_and_exits_nonzero(env):
    nb = make_notebook(env / "tiny.ipynb", BODY)
    r = cli("run", str(nb), "-p", "fail", "true", "--name", "bad")
    assert r.returncode == 1
    html = (env / "reports" / "tiny" / "bad.html").read_text()
    assert "status-failed" in html and "asked to fail" in html

def test_bad_params_give_clear_errors(env):
    nb = make_notebook(env / "tiny.ipynb", BODY)
    r = cli("run", str(nb), "-p", "seed", "two")
    assert r.returncode == 2 and "parameter 'seed' expects an integer" in r.stderr
    r = cli("run", str(nb), "-p", "sede", "1")
    assert r.returncode == 2 and "unknown parameter 'sede'" in r.stderr and "seed" in r.stderr
    r = cli("sweep", str(nb), "--grid", "seed")
    assert r.returncode == 2 and "KEY=V1,V2" in r.stderr

def test_unknown_setting_is_rejected(env, monkeypatch):
    monkeypatch.setenv("LABMOD_RUNS_DIRECTORY", "x")
    r = cli("report")
    assert r.returncode == 2 and "runs_directory" in r.stderr and "LABMOD_RUNS_DIRECTORY" in r.stderr

def test_sweep_over_seeds_shows_mean_and_ci(env):
    nb = make_notebook(env / "tiny.ipynb", BODY)
    r = cli("sweep", str(nb), "--grid", "seed=0,1,2", "--grid", "scale=1.0,2.0", "--name", "s")
    assert r.returncode == 0, r.stderr
    page = (env / "reports" / "tiny" / "sweep-s.html").read_text()
    # scale=1: successes 0.5, 0.6, 0.7 -> mean 0.6, CI half-width 4.303*0.1/sqrt(3) = 0.248
    assert "0.6 ± 0.248" in page and "1.2 ± 0.497" in page and "data:image/png" in page
    idx = (env / "reports" / "index.html").read_text()
    assert "sweep-s.html" in idx and "sweep-s-000.html" in idx
    r = cli("report"); assert r.returncode == 0 and "index.html" in r.stdout
