"Every experiment notebook runs end to end in quick mode through `labmod run`, into a report marked ok."
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "nbs" / "experiments").glob("*.ipynb"))

@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_experiment_quick(nb, tmp_path):
    env = {**os.environ, "LABMOD_RUNS_DIR": str(tmp_path / "runs"), "LABMOD_REPORTS_DIR": str(tmp_path / "reports"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "labmod.lab.cli", "run", str(nb), "-p", "quick", "true", "--name", "quick"],
                       capture_output=True, text=True, env=env, timeout=600)
    meta = json.loads((tmp_path / "reports" / nb.stem / "quick.json").read_text())
    assert r.returncode == 0 and meta["status"] == "ok", meta.get("error") or r.stderr[-3000:]
    assert meta["final"], "the notebook recorded no headline results (run.final)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_parameters_cell(nb):
    """Every experiment takes `quick` (off by default), and `backend` and `lora` where it loads a model (env_tour and
    s2s_stats run no policy); papermill's own reader sees every parameter (`papermill --help-notebook` lists it): a
    comment it cannot parse (one with an '=' in it) hides the parameter."""
    import nbformat
    from papermill.translators import PythonTranslator
    from labmod.lab.runner import notebook_parameters
    ours, cells = notebook_parameters(nb), nbformat.read(nb, 4).cells
    assert ours.get("quick") is False, sorted(ours)
    if "load_lm(" in "".join(c.source for c in cells) or "model" in ours:
        assert "backend" in ours and "lora" in ours, sorted(ours)
    cell = next(c for c in cells if "parameters" in c.metadata.get("tags", []))
    theirs = [p.name for p in PythonTranslator.inspect(cell)]
    assert sorted(theirs) == sorted(ours), f"papermill cannot read {sorted(set(ours) - set(theirs))}: no '=' in their comments"


def test_dreamgym_transfer_quick(tmp_path):
    """dreamgym_table1's transfer path (Figure 3-middle): rows trained on coin, read on twc, beside SFT on twc's expert
    episodes, with the paired readings against that control."""
    env = {**os.environ, "LABMOD_RUNS_DIR": str(tmp_path / "runs"), "LABMOD_REPORTS_DIR": str(tmp_path / "reports"), "OMP_NUM_THREADS": "1"}
    nb = ROOT / "nbs" / "experiments" / "dreamgym_table1.ipynb"
    r = subprocess.run([sys.executable, "-m", "labmod.lab.cli", "run", str(nb), "-p", "quick", "true", "-p", "eval_games", '["twc"]',
                        "-p", "sft_target", "true", "-p", "rows", '["real", "dreamgym"]', "-p", "controls", "false", "--name", "quick"],
                       capture_output=True, text=True, env=env, timeout=600)
    meta = json.loads((tmp_path / "reports" / "dreamgym_table1" / "quick.json").read_text())
    assert r.returncode == 0 and meta["status"] == "ok", meta.get("error") or r.stderr[-3000:]
    readings = {x["name"]: x for x in meta["readings"]}
    assert readings["success_dreamgym_grpo vs sft_target"]["paired_with"] == "success_sft_target_grpo"
    assert readings["success_real_grpo vs sft_target"]["paired_with"] == "success_sft_target_grpo"
    assert readings["success_dreamgym_grpo vs warm start"]["paired_with"] == "success_warm_start"
    run_dir = tmp_path / "runs" / "dreamgym_table1" / "quick"
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(x.get("mode") == "sft_target" and x.get("real_train_steps") == 0 for x in rows), "no SFT-on-target row"
