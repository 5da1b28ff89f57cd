"""Reports a researcher reads (issue 18): per-seed readings through `labmod run`, verdicts and caveats from the run's own
data, superseded runs, the claims page, and the committed reports (portable, offline, re-rendered without a re-run)."""
import json, re, shutil, subprocess, sys
from pathlib import Path
import nbformat, pytest

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
LABMOD = [sys.executable, "-m", "labmod.lab.cli"]
# absolute paths of a machine: what a committed report must not contain
ABS_PATH = re.compile(r"(?<![\w.~<>-])/(?:work|tmp|home|root|Users|mnt|opt|var)/[\w.-]")

BODY = """
from labmod.lab.experiment import start_run
run = start_run("tinyr", dict(seeds=seeds))
base = {s: 0.25 + 0.05 * s for s in seeds}
trained = {s: v + 0.10 + 0.01 * s for s, v in base.items()}
run.reading("success/base", {s: v for s, v in base.items() if not (lose and s == seeds[-1])}, episodes=16, success=True, headline=False)
run.reading("success/trained", trained, episodes=16, success=True, paired_with="success/base")
run.check("action budget", cut == 0, f"{cut} of 6 demonstration actions were cut at 16 tokens", blocks=["success/trained"] if block else [])
print("done")
"""

def make_notebook(path: Path, body: str = BODY) -> Path:
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell("seeds = [0, 1, 2]\ncut = 0\nblock = False\nlose = False"); p.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# tiny readings experiment"), p, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path); return path

@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("LABMOD_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("LABMOD_REPORTS_DIR", str(tmp_path / "reports"))
    return tmp_path

def cli(*args):
    return subprocess.run([*LABMOD, *args], capture_output=True, text=True, timeout=600)

def meta_of(env, name, exp="tinyr"): return json.loads((env / "reports" / exp / f"{name}.json").read_text())


def test_readings_reach_the_json_and_open_the_report(env):
    nb = make_notebook(env / "tinyr.ipynb")
    r = cli("run", str(nb), "-p", "cut", "3", "-p", "lose", "true", "--name", "r")
    assert r.returncode == 0, r.stderr[-3000:]
    m = meta_of(env, "r")
    rd = {x["name"]: x for x in m["readings"]}
    t = rd["success/trained"]
    assert [p["seed"] for p in t["per_seed"]] == [0, 1, 2] and t["n_seeds"] == 3 and t["episodes"] == 16
    assert abs(t["mean"] - (0.30 + 0.10 + 0.01)) < 1e-9 and t["ci95"] > 0 and all(len(p["wilson95"]) == 2 for p in t["per_seed"])
    assert t["paired_with"] == "success/base" and t["paired"]["n_seeds"] == 2 and t["verdict"]["label"] == "effect beyond its CI"
    assert rd["success/base"]["n_seeds"] == 2   # the reading counts its own seeds, not the run's
    assert m["final"]["success/trained"] == t["mean"] and not m["checks"][0]["ok"]
    html = (env / "reports" / "tinyr" / "r.html").read_text()
    head = html.index('id="labmod-header"')
    order = [html.index(s, head) for s in ("success/trained: 0.410", "effect beyond its CI", "check failed: action budget: 3 of 6 demonstration",
                                             "success/base has 2 of the run's 3 seeds", "<h3>Readings</h3>", "data:image/png", "Provenance",
                                             "tiny readings experiment")]
    assert order == sorted(order), "the report opens with the headline and its verdict, then caveats, readings, provenance, the notebook"
    assert "<script" not in html and str(env) not in html and str(env) not in json.dumps(m)

def test_seed_list_parameter_gives_int_seeds_and_a_two_seed_reading(env):
    nb = make_notebook(env / "tinyr.ipynb")
    assert cli("run", str(nb), "-p", "seeds", "0,1", "--name", "two").returncode == 0
    t = {x["name"]: x for x in meta_of(env, "two")["readings"]}["success/trained"]
    assert t["seeds"] == [0, 1] and t["n_seeds"] == 2 and "(2 seeds × 16 episodes)" in (env / "reports" / "tinyr" / "two.html").read_text()

def test_a_blocking_check_makes_the_reading_not_runnable(env):
    nb = make_notebook(env / "tinyr.ipynb")
    assert cli("run", str(nb), "-p", "cut", "3", "-p", "block", "true", "--name", "b").returncode == 0
    t = {x["name"]: x for x in meta_of(env, "b")["readings"]}["success/trained"]
    assert t["verdict"]["label"] == "not runnable at this scale" and "3 of 6" in t["verdict"]["why"]

def test_superseded_runs_are_marked_and_reports_rerender_without_runs(env):
    nb = make_notebook(env / "tinyr.ipynb")
    for name, extra in [("first", []), ("second", []), ("other", ["-p", "cut", "1"])]:
        assert cli("run", str(nb), *extra, "--name", name).returncode == 0
    assert meta_of(env, "first")["superseded"]["by"] == "second" and "superseded" not in meta_of(env, "second")
    assert "superseded" not in meta_of(env, "other")                      # another parameter set
    assert "Superseded</b> by" in (env / "reports" / "tinyr" / "first.html").read_text()
    shutil.rmtree(env / "runs")                                            # a fresh clone has no raw run data
    r = cli("report", "--supersede", "tinyr/other", "--reason", "ran with actions cut at 16 tokens")
    assert r.returncode == 0, r.stderr[-3000:]
    other = (env / "reports" / "tinyr" / "other.html").read_text()
    assert "ran with actions cut at 16 tokens" in other and "<h3>Readings</h3>" in other and other.count('id="labmod-header"') == 1
    idx = (env / "reports" / "index.html").read_text()
    assert "ran with actions cut at 16 tokens" in idx and "2 superseded runs" in idx
    r = cli("report", "--supersede", "tinyr/nosuch", "--reason", "x")
    assert r.returncode == 2 and "no report tinyr/nosuch" in r.stderr and "Traceback" not in r.stderr
    r = cli("report", "--note", "tinyr/second", "--reason", "3 seeds: 5 would not fit the hour")   # a note joins the caveats
    assert r.returncode == 0, r.stderr[-3000:]
    assert "note: 3 seeds: 5 would not fit the hour" in (env / "reports" / "tinyr" / "second.html").read_text()
    assert meta_of(env, "second")["notes"][0]["text"] == "3 seeds: 5 would not fit the hour"


def claims():
    from labmod.lab.report import load_claims
    return load_claims(ROOT / "nbs" / "experiments" / "claims.yaml")

def test_claims_map_names_every_experiment_notebook():
    from labmod.lab.report import claimed_experiments
    c = claims()
    nbs = {p.stem for p in (ROOT / "nbs" / "experiments").glob("*.ipynb")}
    missing = nbs - claimed_experiments(c)
    assert not missing, f"add a line for these notebooks to nbs/experiments/claims.yaml: {sorted(missing)}"
    named = {n for p in c["papers"].values() for it in p["items"] for n in it["notebook"]} | {n for it in c["lab"] for n in it["notebook"]}
    assert named <= nbs, f"the claims map names notebooks that do not exist: {sorted(named - nbs)}"
    assert set(c["papers"]) == {"dreamgym", "state2state", "webgym"}

def test_claims_page_over_the_committed_reports(tmp_path):
    from labmod.lab.report import render_reports
    reports = tmp_path / "reports"; shutil.copytree(REPORTS, reports)
    idx = render_reports(reports, ROOT / "nbs" / "experiments" / "claims.yaml").read_text()
    from html import unescape
    text = unescape(re.sub(r"<[^>]+>", " ", idx))
    for p in claims()["papers"].values():
        for it in p["items"]:
            assert it["claim"] in text, it
            if not it["notebook"]: assert "no notebook yet" in text
    metas = [json.loads(j.read_text()) for j in REPORTS.glob("*/*.json")]
    assert len(metas) >= 26 and all(f'{m["experiment"]}/{m["html"]}' in idx for m in metas)   # every run, linked
    sup = {(m["experiment"], m["run_id"][9:15]) for j in reports.glob("*/*.json") if (m := json.loads(j.read_text())).get("superseded")}
    # the six the issue names (later runs may supersede more, never fewer)
    assert sup >= {("dreamgym_table1", "155438"), ("dreamgym_table1", "213922"), ("dreamgym_data_size", "172822"),
                   ("dreamgym_fidelity_cost", "173519"), ("s2s_pipeline", "075042"), ("s2s_pipeline", "100858")}, sup
    old = [m for m in metas if not m.get("readings")]
    assert idx.count("no per-seed data in this run") >= len(old)   # runs without per-seed data say so rather than guess a CI
    # a current run always carries per-seed data: the runs recorded before readings existed are all superseded, with a reason
    assert all((m.get("superseded") or {}).get("reason") for m in old), [f'{m["experiment"]}/{m["run_id"]}' for m in old if not m.get("superseded")]

def test_committed_reports_are_portable_offline_and_rerendered():
    htmls = sorted(REPORTS.glob("*/*.html"))
    assert len(htmls) >= 26   # a committed report is never deleted (superseded ones are marked)
    for h in htmls + [REPORTS / "index.html"]:
        t = h.read_text()
        assert "<script" not in t and "cdnjs" not in t, f"{h} loads scripts (offline readers cannot fetch them)"
        assert not ABS_PATH.search(t), f"{h} names a machine path: {ABS_PATH.search(t).group(0)}"
    for h in htmls:
        t = h.read_text()
        assert t.count('id="labmod-header"') == 1 and 'class="labmod-header"' not in t, f"{h} was not re-rendered (labmod report)"
    for j in REPORTS.glob("*/*.json"):
        m = json.loads(j.read_text())
        assert not ABS_PATH.search(json.dumps(m)), f"{j} names a machine path"
        assert "no per-seed data" in (j.with_suffix(".html")).read_text() or m.get("readings")
