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
    assert "status-ok" in html and '"seed": 2' in html and "machine" in html and "commit" in html
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


# --- issue 17, item 10: bad input is a clear error naming the thing to fix (exit 2, no traceback) ---------------------

def assert_clear_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-3000:]
    for n in needles: assert n in r.stderr, (n, r.stderr[-2000:])

def main(*args):
    "`labmod ARGS` in this process (bad input is refused before any kernel starts): a CompletedProcess-like result."
    import contextlib, io, types
    from labmod.lab.cli import main as labmod_main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = labmod_main(list(args))
    return types.SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())

def test_list_parameters_coerce_elementwise():
    from labmod.lab.runner import coerce_param, ParameterError
    d = {"seeds": [0, 1, 2], "lrs": [0.1], "names": ["coin"], "empty": []}
    assert coerce_param("seeds", "0,1", d) == [0, 1] and all(type(s) is int for s in coerce_param("seeds", "0,1", d))
    assert coerce_param("seeds", "[3, 4]", d) == [3, 4] and coerce_param("seeds", "5", d) == [5]
    assert coerce_param("lrs", "1,2e-3", d) == [1.0, 2e-3] and coerce_param("names", "coin,twc", d) == ["coin", "twc"]
    assert coerce_param("empty", "a,b", d) == ["a", "b"]
    for raw in ["0,x", '["0", "1"]', "[0.5]"]:
        with pytest.raises(ParameterError, match="seeds"): coerce_param("seeds", raw, d)

def test_non_finite_numbers_are_refused(env):
    from labmod.lab.runner import coerce_param, ParameterError
    for raw in ["nan", "inf", "-inf", "NaN", "Infinity"]:
        with pytest.raises(ParameterError, match="finite"): coerce_param("scale", raw, {"scale": 1.0})
    with pytest.raises(ParameterError, match="finite"): coerce_param("lrs", "[NaN]", {"lrs": [0.1]})
    nb = make_notebook(env / "tiny.ipynb", BODY)
    assert_clear_error(main("run", str(nb), "-p", "scale", "nan"), "scale", "finite")
    assert not (env / "runs").exists()

@pytest.mark.parametrize("name", ["../../escaped", "a/b", "..", ".", "", "a\\b", "x" * 200])
def test_run_name_is_one_path_component(env, name):
    nb = make_notebook(env / "tiny.ipynb", BODY)
    assert_clear_error(main("run", str(nb), "--name", name), "--name")
    assert not (env / "escaped").exists() and not (env / "runs").exists() and not (env / "reports").exists()

def test_bad_input_through_the_real_command(env):
    nb = make_notebook(env / "tiny.ipynb", BODY)
    assert_clear_error(cli("run", str(nb), "--name", "../../escaped"), "--name")
    assert_clear_error(cli("run", str(env)), "not a notebook")
    assert not (env / "escaped").exists() and not (env / "runs").exists()

def test_reused_run_name_is_refused(env):
    nb = make_notebook(env / "tiny.ipynb", BODY)
    assert cli("run", str(nb), "--name", "once").returncode == 0
    before = (env / "runs" / "tiny" / "once" / "metrics.jsonl").read_text()
    r = cli("run", str(nb), "-p", "seed", "1", "--name", "once")
    assert_clear_error(r, "once", "already")
    assert (env / "runs" / "tiny" / "once" / "metrics.jsonl").read_text() == before  # the first run is untouched
    assert json.loads((env / "reports" / "tiny" / "once.json").read_text())["effective_params"]["seed"] == 0

def test_run_needs_a_notebook_file(env):
    (env / "folder").mkdir()
    assert_clear_error(main("run", str(env / "folder")), "folder", "not a notebook")
    (env / "script.py").write_text("print(1)\n")
    assert_clear_error(main("run", str(env / "script.py")), "script.py", "not a notebook")
    (env / "broken.ipynb").write_text("{not json")
    assert_clear_error(main("run", str(env / "broken.ipynb")), "broken.ipynb")
    assert_clear_error(main("sweep", str(env / "folder"), "--grid", "seed=0,1"), "not a notebook")

def test_empty_path_setting_is_an_error(env, monkeypatch):
    monkeypatch.setenv("LABMOD_REPORTS_DIR", "")
    assert_clear_error(main("report"), "LABMOD_REPORTS_DIR", "empty")
    nb = make_notebook(env / "tiny.ipynb", BODY)
    assert_clear_error(main("run", str(nb)), "LABMOD_REPORTS_DIR", "empty")

def test_build_index_tolerates_any_json(env):
    d = env / "reports" / "tiny"; d.mkdir(parents=True)
    for i, text in enumerate(["[1, 2]", '"a string"', "null", "3", '{"experiment": "tiny", "run_id"', "", "{}"]):
        (d / f"junk{i}.json").write_text(text)
    r = main("report")
    assert r.returncode == 0, r.stderr
    idx = (env / "reports" / "index.html").read_text()
    assert "junk0.json" in idx and "not a report" in idx and "junk4.json" in idx

def test_unwritable_reports_dir_names_the_setting(env, monkeypatch):
    blocker = env / "a_file"; blocker.write_text("x")
    monkeypatch.setenv("LABMOD_REPORTS_DIR", str(blocker / "reports"))
    nb = make_notebook(env / "tiny.ipynb", BODY)
    r = main("run", str(nb), "--name", "w")
    assert_clear_error(r, "reports_dir", "LABMOD_REPORTS_DIR", "not writable")
    assert not (env / "runs" / "tiny" / "w").exists()   # refused before anything ran
    assert_clear_error(main("report"), "reports_dir", "LABMOD_REPORTS_DIR")


# --- issue 17, item 5: final.json and index.html are written atomically; readers tolerate damage ----------------------

KILL_WRITER = """
import sys
from labmod.lab.experiment import Run
run = Run(sys.argv[1], {})
print("ready", flush=True)
i = 0
while True:
    run.final(i=i, blob="x" * 2_000_000); i += 1
"""

def test_final_json_survives_kills(tmp_path):
    import random, signal, time
    rng, damaged = random.Random(0), []
    for k in range(20):
        d = tmp_path / f"r{k}"
        p = subprocess.Popen([sys.executable, "-c", KILL_WRITER, str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.stdout.readline().strip() != "ready": p.wait(); pytest.fail(f"the writer did not start: {p.stderr.read()[-2000:]}")
        time.sleep(0.15 + rng.random() * 0.4)
        p.send_signal(signal.SIGKILL); p.wait()
        f = d / "final.json"
        if f.exists():
            try: json.loads(f.read_text())
            except json.JSONDecodeError: damaged.append(k)
    assert not damaged, f"kills {damaged} of 20 left a partial final.json"

INDEX_WRITER = """
import sys
from labmod.lab.report import build_index
print("ready", flush=True)
while True: build_index(sys.argv[1])
"""

def test_index_is_never_seen_partial(tmp_path):
    reports = tmp_path / "reports"
    for i in range(40):
        d = reports / f"exp{i % 8}"; d.mkdir(parents=True, exist_ok=True)
        (d / f"r{i}.json").write_text(json.dumps({"experiment": f"exp{i % 8}", "run_id": f"r{i}", "kind": "run", "status": "ok",
                                                  "start": 1e9 + i, "params": {"seed": i, "pad": "y" * 2000}, "html": f"r{i}.html"}))
    from labmod.lab.report import build_index
    build_index(reports)
    p = subprocess.Popen([sys.executable, "-c", INDEX_WRITER, str(reports)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        reads = [(reports / "index.html").read_text() for _ in range(400)]
    finally:
        p.kill(); p.wait()
    partial = sum(not r.rstrip().endswith("</html>") for r in reads)
    assert partial == 0, f"{partial} of {len(reads)} reads saw a partial index.html"

def test_damaged_final_json_is_tolerated(env):
    body = BODY + "\nopen('final.json', 'w').write('{\"success\": 0.')\n"
    nb = make_notebook(env / "tiny.ipynb", body)
    r = cli("run", str(nb), "--name", "cut")
    assert "Traceback" not in r.stderr and "JSONDecodeError" not in r.stderr, r.stderr[-3000:]
    meta = json.loads((env / "reports" / "tiny" / "cut.json").read_text())
    assert any("final.json" in p and "cut off" in p for p in meta["problems"]), meta.get("problems")
    assert meta["final"]["reward"] is not None   # the headline numbers fall back to the last logged metrics
    assert "final.json" in (env / "reports" / "tiny" / "cut.html").read_text()
    from labmod.lab.experiment import Run
    run = Run(env / "runs" / "tiny" / "cut", {})
    with pytest.warns(UserWarning, match="cut off"): assert run.final(x=1) == {"x": 1}


def test_parallel_sweep_runs_write_only_their_own_folders(env):
    "issue 17, item 3: `sweep -j 4` ran 4 kernels that all wrote into the last run's folder (32 records in one, 0 in three)."
    nb = make_notebook(env / "tiny.ipynb", BODY)
    r = cli("sweep", str(nb), "--grid", "seed=0,1,2,3", "-j", "4", "--name", "par")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted(p for p in (env / "runs" / "tiny").iterdir() if (p / "final.json").exists())
    assert len(runs) == 4, runs
    finals = sorted(round(json.loads((p / "final.json").read_text())["success"], 6) for p in runs)
    assert finals == [0.5, 0.6, 0.7, 0.8], finals                      # each run holds its own seed's result
    for p in runs:
        rows = [json.loads(line) for line in (p / "metrics.jsonl").read_text().splitlines() if line.strip()]
        assert len([x for x in rows if "reward" in x]) == 5, (p, rows)   # and only its own 5 records
