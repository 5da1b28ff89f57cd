"""The reports opened as a new user would, offline, in headless Chromium (Debian's, never a downloaded one): the committed
claims page and every report it links, a freshly rendered report with readings, and a negative control that loads a
CDN script the way nbconvert's template did. A page fails on any network request, console or page error, missing
image, link to a file that does not exist, or in-page anchor without its target.
Screenshots go to the test's tmp folder, and to $LAB_SCREENSHOT_DIR when it is set (look at them)."""
import json, os, shutil, time
from pathlib import Path
from urllib.parse import unquote, urlparse
import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium: apt-get install -y chromium")]

# an in-page link resolves as the browser resolves a fragment: the id as written, else percent-decoded (nbconvert's ids are encoded)
LINKS_JS = """() => [...document.querySelectorAll('a[href]')].map(a => { const h = a.getAttribute('href'), f = h.slice(1);
  return {href: a.href, raw: h, anchor_ok: !h.startsWith('#') || !!document.getElementById(f) || !!document.getElementById(decodeURIComponent(f))}; })"""
IMAGES_JS = "() => [...document.images].map(i => ({src: i.getAttribute('src').slice(0, 60), ok: i.complete && i.naturalWidth > 0}))"


def open_page(ctx, path: Path, shot: Path | None = None) -> tuple[list[str], list[str]]:
    "(problems, file links) of the page at `path` as Chromium loads it with every non-file request refused."
    problems, page = [], ctx.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    def route(r):
        if r.request.url.startswith(("file:", "data:")): return r.continue_()
        problems.append(f"network request: {r.request.url}"); return r.abort()
    page.route("**/*", route)
    try:
        page.goto(path.as_uri(), wait_until="load"); page.wait_for_timeout(300)   # late module scripts run after load
        problems += [f"missing image: {i['src']}" for i in page.evaluate(IMAGES_JS) if not i["ok"]]
        files = []
        for a in page.evaluate(LINKS_JS):
            if not a["anchor_ok"]: problems.append(f"anchor without a target: {a['raw']}")
            if a["href"].startswith("file:"):
                target = Path(unquote(urlparse(a["href"]).path))
                if not target.exists(): problems.append(f"broken link: {a['raw']}")
                elif target != path: files.append(target)
        if shot: page.screenshot(path=str(shot), full_page=False)
    finally:
        page.close()
    return problems, files


@pytest.fixture(scope="module")
def browser_ctx():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try: yield browser.new_context(viewport={"width": 1400, "height": 1000})
        finally: browser.close()


def keep(shots: list[Path]):
    if d := os.environ.get("LAB_SCREENSHOT_DIR"):
        Path(d).mkdir(parents=True, exist_ok=True)
        for s in shots:
            if s.exists(): shutil.copy(s, Path(d) / s.name)


def test_committed_claims_page_and_every_report(browser_ctx, tmp_path):
    t0, shots = time.monotonic(), []
    index = REPORTS / "index.html"
    shots.append(tmp_path / "browser_index.png")
    problems, linked = open_page(browser_ctx, index, shots[-1])
    reports = sorted({p for p in linked if p.suffix == ".html" and p.is_relative_to(REPORTS)})
    on_disk = sorted(REPORTS.glob("*/*.html"))
    assert reports == on_disk, f"the index links {len(reports)} of the {len(on_disk)} reports"
    assert {p.suffix for p in linked} <= {".html", ".ipynb"}, linked   # reports, and the notebooks that reproduce them
    for k, rep in enumerate(reports):
        shot = tmp_path / f"browser_{rep.parent.name}_{rep.stem}.png" if k % 9 == 0 else None
        if shot: shots.append(shot)
        more, _ = open_page(browser_ctx, rep, shot)
        problems += [f"{rep.relative_to(REPORTS)}: {p}" for p in more]
    keep(shots)
    print(f"\n{len(reports) + 1} pages in {time.monotonic() - t0:.1f}s; screenshots {[str(s) for s in shots]}")
    assert not problems, "\n".join(problems[:40])


def test_fresh_report_with_readings_and_the_cdn_negative_control(browser_ctx, tmp_path):
    from labmod.lab.experiment import summarize_reading, verdict
    from labmod.lab.report import build_index, git_info, machine_info, render_run_report
    base = summarize_reading("success/base", {0: 0.25, 1: 0.375, 2: 0.30}, episodes=32, success=True, null=0.0)
    trained = summarize_reading("success/trained", {0: 0.40, 1: 0.50, 2: 0.41}, episodes=32, success=True, paired=base)
    for r in (base, trained): r["headline"], r["verdict"] = r is trained, verdict(r)
    meta = {"experiment": "demo", "run_id": "r1", "kind": "run", "status": "ok", "params": {}, "effective_params": {"model": "tiny"},
            "seeds": [0, 1, 2], "git": git_info(), "machine": machine_info(), "start": time.time(), "wall_s": 1.0,
            "readings": [base, trained], "checks": [{"name": "action budget", "ok": False, "detail": "3 of 6 actions were cut"}]}
    reports = tmp_path / "reports"
    page = render_run_report(None, meta, reports / "demo" / "r1.html")
    build_index(reports)
    shots = [tmp_path / "browser_fresh_report.png", tmp_path / "browser_fresh_index.png"]
    problems, _ = open_page(browser_ctx, page, shots[0])
    more, linked = open_page(browser_ctx, reports / "index.html", shots[1])
    keep(shots)
    assert not problems + more, problems + more
    assert page in linked
    # negative control: the page nbconvert's template wrote loads require.js from a CDN; the check must catch it
    cdn = tmp_path / "cdn.html"
    cdn.write_text('<html><head><script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>'
                   '</head><body><img src="missing.png"><a href="nowhere.html">x</a><a href="#nothing">y</a></body></html>')
    problems, _ = open_page(browser_ctx, cdn)
    kinds = {p.split(":")[0] for p in problems}
    assert {"network request", "missing image", "broken link", "anchor without a target"} <= kinds, problems
