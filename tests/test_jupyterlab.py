"""JupyterLab end to end: the lab's server on the repo's .venv kernel, notebooks stepped through in headless Chromium.

What a researcher does, through JupyterLab's own UI: open a library notebook and an experiment notebook, click into
the first code cell, Shift+Enter through the first few code cells, read the outputs. The test checks that each of
those cells ran (prompt `[n]:`), that outputs render (`.jp-OutputArea-output`), that no cell shows an error, and
that the kernel is the notebooks' kernelspec running `.venv/bin/python` (`sys.executable` here). A negative control
(a probe notebook that raises) proves the error check sees errors in this JupyterLab version.

Read-only for the repo: the server serves a temporary copy of `nbs/` with autosave off, runs go to a temporary
`LABMOD_RUNS_DIR`, and Jupyter/IPython config, data, runtime, settings and workspaces dirs are temporary too; the
test checks the repo's notebooks are byte-identical afterwards. Network: the server and the browser only use
127.0.0.1 (news, update checks and the PyPI extension manager are off; Chromium resolves no other host).

Screenshots land in tmp_path; set LAB_SCREENSHOT_DIR to also copy them to a folder you can look at (not a LABMOD_*
name: labmod rejects unknown LABMOD_ variables, and the kernel inherits the environment).
"""
import hashlib, json, os, re, shutil, signal, socket, subprocess, sys, time, urllib.request
from pathlib import Path

import pytest

# Notebooks to step through, relative to the repo root, and how many of their code cells to run. Names are changing:
# edit these. LIBRARY_NB: all of its code cells are cheap and only the last one prints, so run them all.
# EXPERIMENT_NB: the `parameters` cell and the setup cell after it (imports, task lists; prints the split).
LIBRARY_NB, LIBRARY_CODE_CELLS = "nbs/00_core.ipynb", 10
EXPERIMENT_NB, EXPERIMENT_CODE_CELLS = "nbs/experiments/grpo_baseline.ipynb", 2

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]  # no host but 127.0.0.1 resolves
SERVER_START_S, KERNEL_IDLE_S, CELLS_S = 60, 60, 90   # waits; the whole test stays well under 3 minutes here
STDERR = "application/vnd.jupyter.stderr"  # JupyterLab 4 renders error outputs AND stderr streams with this mime
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*\w*(Error|Exception)\b.*:", re.M)

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium: apt-get install -y chromium")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def sha(p: Path) -> str: return hashlib.sha256(p.read_bytes()).hexdigest()


def kernel_processes(runtime_dir: Path) -> dict:
    "kernel id -> (pid, argv, OMP_NUM_THREADS) for the kernels whose connection file is in `runtime_dir`."
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit(): continue
        try:
            argv = [a.decode(errors="replace") for a in (p / "cmdline").read_bytes().split(b"\0") if a]
            env = dict(kv.split(b"=", 1) for kv in (p / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError: continue
        for a in argv:
            if a.startswith(str(runtime_dir)) and (m := re.search(r"kernel-([0-9a-f-]+)\.json$", a)):
                out[m.group(1)] = (int(p.name), argv, env.get(b"OMP_NUM_THREADS", b"").decode())
    return out


class Lab:
    "A JupyterLab server in its own process group, serving a temporary copy of the repo's nbs/."
    def __init__(self, tmp: Path):
        self.tmp, self.root, self.rt = tmp, tmp / "nbs", tmp / "jupyter-runtime"
        shutil.copytree(REPO / "nbs", self.root, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "_proc", "__pycache__"))
        settings = tmp / "lab-user-settings"
        for plugin, values in {"@jupyterlab/docmanager-extension/plugin": {"autosave": False},
                               "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}.items():
            f = settings / f"{plugin}.jupyterlab-settings"; f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
        self.env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_PATH", "JUPYTER_TOKEN")}
        self.env.update(OMP_NUM_THREADS="1", LABMOD_RUNS_DIR=str(tmp / "runs"), JUPYTER_PREFER_ENV_PATH="1",
                        JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),
                        JUPYTER_RUNTIME_DIR=str(self.rt), IPYTHONDIR=str(tmp / "ipython"))
        self.token = hashlib.sha256(os.urandom(16)).hexdigest()[:32]
        self.settings, self.proc, self.log = settings, None, tmp / "server.log"

    def start(self):
        for attempt in range(3):  # a free port can be taken between choosing and binding it: retry on a new one
            self.port = free_port(); self.base = f"http://127.0.0.1:{self.port}"
            cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", *(["--allow-root"] if os.getuid() == 0 else []),
                   "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
                   f"--LabApp.user_settings_dir={self.settings}", f"--LabApp.workspaces_dir={self.tmp / 'lab-workspaces'}",
                   "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                   "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True"]
            t0 = time.monotonic()
            self.proc = subprocess.Popen(cmd, env=self.env, cwd=self.tmp, stdin=subprocess.DEVNULL,
                                         stdout=self.log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)
            while time.monotonic() - t0 < SERVER_START_S and self.proc.poll() is None:
                try:
                    if self.api("/api/status"): self.start_s = time.monotonic() - t0; return self
                except OSError: time.sleep(0.2)
            self.stop()
            if "already in use" not in self.log.read_text(): break
        raise AssertionError(f"JupyterLab did not answer on {self.base} within {SERVER_START_S}s:\n{self.log_tail()}")

    def api(self, path: str):
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as r: return json.loads(r.read())

    def log_tail(self, n: int = 4000) -> str: return self.log.read_text()[-n:] if self.log.exists() else ""

    def stop(self):
        "SIGTERM the server's process group (it shuts its kernels down), SIGKILL what is left, kernels included."
        if self.proc is None: return
        kernels = kernel_processes(self.rt)  # kernels run in their own sessions: not in the server's process group
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try: os.killpg(self.proc.pid, sig)
            except ProcessLookupError: break
            try: self.proc.wait(wait); break
            except subprocess.TimeoutExpired: pass
        for pid, _, _ in kernels.values():
            try: os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError): pass
        self.proc = None


@pytest.fixture
def lab(tmp_path):
    server = Lab(tmp_path)
    try: yield server.start()
    finally: server.stop()


JS_STATE = """([path, idx]) => {
  const dom = [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')];
  const panel = [...window.jupyterapp.shell.widgets('main')].find(w => w.context && w.context.path === path);
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return {
    n_dom: dom.length, n_model: panel ? panel.content.model.cells.length : -1,
    kernel: kernel ? kernel.name : null, kernel_status: kernel ? kernel.status : null,
    kernel_display: panel ? panel.sessionContext.kernelDisplayName : null,
    indicator: (document.querySelector('.jp-Notebook-ExecutionIndicator') || {dataset: {}}).dataset.status || null,
    active: dom.findIndex(c => c.classList.contains('jp-mod-active')),
    cells: idx.map(i => {
      const c = dom[i], m = panel ? panel.content.model.cells.get(i) : null;
      return {index: i, prompt: c ? c.querySelector('.jp-InputArea-prompt').textContent.trim() : null,
              dom_outputs: c ? [...c.querySelectorAll('.jp-OutputArea-output')].map(o =>
                  ({mime: o.dataset.mimeType || null, text: o.innerText.slice(0, 2000)})) : [],
              model_outputs: m ? m.outputs.toJSON().map(o => ({type: o.output_type, name: o.name || o.ename || null})) : []};
    })};
}"""


def state(page, rel: str, idx: list[int]) -> dict:
    return page.evaluate(JS_STATE, [rel, idx])


def problems_in(st: dict) -> list[str]:
    "Errors shown by the run cells: error outputs in the model, and stderr outputs in the DOM that read as a traceback."
    out = []
    for c in st["cells"]:
        errs = [o["name"] for o in c["model_outputs"] if o["type"] == "error"]
        shown = [o["text"] for o in c["dom_outputs"] if o["mime"] == STDERR and TRACEBACK.search(o["text"])]
        if errs or shown:
            out.append(f"cell {c['index']} {c['prompt']} shows an error: {errs or ''} {shown[0][-800:] if shown else ''}")
    return out


def run_cells(page, lab: Lab, rel: str, n_code: int, ws: str, shot: Path) -> dict:
    """Open `rel` (relative to the served nbs/) in a fresh workspace, Shift+Enter through its first `n_code` code
    cells from the first one, wait until they ran (or one failed), screenshot; return timings and the final state."""
    t0 = time.monotonic()
    cells = json.loads((lab.root / rel).read_text())["cells"]
    idx = [i for i, c in enumerate(cells) if c["cell_type"] == "code"][:n_code]
    assert idx, f"{rel} has no code cells"
    page.goto(f"{lab.base}/lab/workspaces/{ws}/tree/{rel}?token={lab.token}")
    page.wait_for_function("n => document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell').length === n",
                           arg=len(cells), timeout=60_000)
    t_open = time.monotonic() - t0
    # The kernel is up when the notebook's session has a kernel and the toolbar's execution indicator reads idle
    # (the indicator alone also reads idle while the toolbar still says "No Kernel").
    page.wait_for_function(f"""([p]) => {{ const s = ({JS_STATE})([p, []]);
        return s.kernel !== null && s.kernel_status === 'idle' && s.indicator === 'idle'; }}""",
                           arg=[rel], timeout=KERNEL_IDLE_S * 1000)
    t_kernel = time.monotonic() - t0
    prompt = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(idx[0]).locator(".jp-InputArea-prompt")
    prompt.click()                        # selects the cell in command mode, as a user clicking beside it
    for i in range(idx[0], idx[-1]):      # Shift+Enter: run (a markdown cell: render) and select the next cell
        page.keyboard.press("Shift+Enter")
        page.wait_for_function(f"() => ({JS_STATE})(['{rel}', []]).active === {i + 1}", timeout=10_000)
    page.keyboard.press("Control+Enter")  # the last one: run without advancing (no new cell at the notebook's end)
    # Done when no run cell is queued/running ([*]) and the kernel is idle, and either every run cell has its
    # execution count or one failed (JupyterLab then cancels the queued cells below it, they stay [ ]).
    page.wait_for_function(f"""([p, idx]) => {{ const s = ({JS_STATE})([p, idx]);
        const ran = s.cells.every(c => /^\\[\\d+\\]:$/.test(c.prompt));
        const failed = s.cells.some(c => c.model_outputs.some(o => o.type === 'error'));
        return s.kernel_status === 'idle' && s.indicator === 'idle' && !s.cells.some(c => c.prompt === '[*]:') && (ran || failed); }}""",
                           arg=[rel, idx], timeout=CELLS_S * 1000)
    t_cells = time.monotonic() - t0
    st = state(page, rel, idx)
    last = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(idx[-1])
    (last.locator(".jp-Cell-outputWrapper") if st["cells"][-1]["dom_outputs"] else last).scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.screenshot(path=str(shot))
    st["timing_s"] = {"open": round(t_open, 1), "kernel_idle": round(t_kernel, 1), "cells_done": round(t_cells, 1)}
    return st


def test_jupyterlab_steps_through_notebooks(lab, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    t0 = time.monotonic()
    notebooks = [(LIBRARY_NB, LIBRARY_CODE_CELLS), (EXPERIMENT_NB, EXPERIMENT_CODE_CELLS)]
    for nb, _ in notebooks: assert (REPO / nb).is_file(), f"{nb} is gone: edit LIBRARY_NB / EXPERIMENT_NB in {__file__}"
    before = {nb: sha(REPO / nb) for nb, _ in notebooks}
    rels = [str(Path(nb).relative_to("nbs")) for nb, _ in notebooks]
    declared = {json.loads((REPO / nb).read_text())["metadata"]["kernelspec"]["name"] for nb, _ in notebooks}
    specs = lab.api("/api/kernelspecs")["kernelspecs"]
    assert declared <= set(specs), f"notebooks declare kernelspecs {declared}, the server knows {sorted(specs)}"

    probe = "_jlab_error_probe.ipynb"  # negative control, only in the served copy
    (lab.root / probe).write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": s}
        for i, s in enumerate(["print('before the error')", "1 / 0", "print('after the error')"])]}))

    results, shots, external, page_errors = {}, {}, [], []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            ctx.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:"))
                   else external.append(r.url))
            for k, (rel, n) in enumerate([(r, n) for r, (_, n) in zip(rels, notebooks)] + [(probe, 3)]):
                page = ctx.new_page()
                page.on("pageerror", lambda e: page_errors.append(str(e)))
                shots[rel] = tmp_path / f"jupyterlab_{Path(rel).stem}.png"
                try:
                    results[rel] = run_cells(page, lab, rel, n, f"t{k}", shots[rel])
                except Exception:
                    page.screenshot(path=str(shots[rel]))  # what the page showed when the wait gave up
                    raise
                finally:
                    page.close()
        finally:
            browser.close()
            if d := os.environ.get("LAB_SCREENSHOT_DIR"):
                Path(d).mkdir(parents=True, exist_ok=True)
                for s in shots.values():
                    if s.exists(): shutil.copy(s, Path(d) / s.name)
    kernels = kernel_processes(lab.rt)
    sessions = {s["path"]: s["kernel"] for s in lab.api("/api/sessions")}
    print(f"\nJupyterLab server up in {lab.start_s:.1f}s; test body {time.monotonic() - t0:.1f}s; screenshots {sorted(map(str, shots.values()))}")

    failures = []
    for (nb, _), rel in zip(notebooks, rels):
        st = results[rel]
        print(f"{nb}: {st['timing_s']} kernel {st['kernel']} ({st['kernel_display']}); cells",
              [(c["index"], c["prompt"], [o["mime"] for o in c["dom_outputs"]]) for c in st["cells"]])
        failures += [f"{nb}: {p}" for p in problems_in(st)]
        failures += [f"{nb}: cell {c['index']} did not run (prompt {c['prompt']})" for c in st["cells"] if not re.fullmatch(r"\[\d+\]:", c["prompt"] or "")]
        failures += [f"{nb}: cell {c['index']} has {len(c['model_outputs'])} outputs in the model, {len(c['dom_outputs'])} shown"
                     for c in st["cells"] if len(c["model_outputs"]) != len(c["dom_outputs"])]
        for c in st["cells"]:
            for o in c["dom_outputs"]:
                if o["mime"] == STDERR and not TRACEBACK.search(o["text"]): print(f"  note: {nb} cell {c['index']} wrote to stderr: {o['text'][:300]!r}")
        if not any(c["dom_outputs"] for c in st["cells"]): failures.append(f"{nb}: none of the run cells shows an output")
        want = json.loads((REPO / nb).read_text())["metadata"]["kernelspec"]["name"]
        if st["kernel"] != want: failures.append(f"{nb}: kernel {st['kernel']!r}, the notebook declares {want!r}")
        kid = sessions.get(rel, {}).get("id")
        if kid not in kernels: failures.append(f"{nb}: no kernel process found for session kernel {kid}")
        else:
            pid, argv, omp = kernels[kid]
            if argv[0] != sys.executable or Path(argv[0]).parent != Path(sys.prefix) / "bin":  # the venv's own python
                failures.append(f"{nb}: kernel runs {argv[0]}, not {sys.executable} (venv {sys.prefix})")
            if omp != "1": failures.append(f"{nb}: kernel has OMP_NUM_THREADS={omp!r}")
    # The negative control must be caught: cell 1 raises (an error output in the model, a traceback shown), nothing
    # else is flagged. (Whether cell 2 runs depends on timing: JupyterLab cancels only cells already queued when the
    # error arrives, and on a loaded machine the kernel can answer before the next Shift+Enter.)
    ctrl = results[probe]
    caught = problems_in(ctrl)
    if not (len(caught) == 1 and caught[0].startswith("cell 1 ") and "ZeroDivisionError" in caught[0]):
        failures.append(f"error check missed the probe's ZeroDivisionError: {caught} {ctrl['cells']}")
    if external: failures.append(f"the browser tried hosts other than 127.0.0.1: {external[:5]}")
    if page_errors: print("  note: page errors:", page_errors[:5])
    changed = [nb for nb in before if sha(REPO / nb) != before[nb]]
    if changed: failures.append(f"repo notebooks changed on disk: {changed}")
    assert not failures, "\n".join(failures) + f"\n--- server log tail ---\n{lab.log_tail()}"
