"BrowserEnv against real Chromium: MiniWoB++ episodes, the action grammar, seeds, and the host allowlist."
import http.server, threading
import pytest
from labmod.core import Task
from labmod.envs.core import list_tasks, make_env, MissingDependency
from labmod.envs.browser import EXPERT_TASKS, BrowserEnv, StaticSite


def wob(task: str, seed: int = 0) -> Task:
    return Task(id=f"miniwob/{task}/{seed}", env="miniwob", config={"task": task, "seed": seed})


def play_expert(env, task: Task, max_steps: int = 12):
    env.reset(task)
    for _ in range(max_steps):
        action = env.expert_action()
        assert action is not None, f"no expert action for {task.id}"
        step = env.step(action)
        assert step.info["valid"], step.obs.text
        if step.done: return step
    raise AssertionError(f"{task.id} did not end in {max_steps} expert steps")


@pytest.fixture(scope="module")
def env():
    e = make_env("miniwob", step_limit=15)
    yield e
    e.close()


@pytest.fixture(scope="module")
def web():
    e = make_env("web", step_limit=5)
    yield e
    e.close()


@pytest.mark.parametrize("name", ["click-button", "enter-text", "click-checkboxes", "choose-list", "use-autocomplete", "click-dialog"])
def test_reset_and_a_valid_step(env, name):
    obs = env.reset(wob(name, 3))
    assert obs.text.startswith("Task: ") and obs.data["instruction"] and obs.data["instruction"] in obs.text
    nodes = obs.data["axtree"]
    assert nodes and all(f"[{n['id']}] {n['role']}" in obs.text for n in nodes if n["id"] is not None)
    step = env.step("scroll(down)")
    assert step.info["valid"] and not step.done and step.reward == 0.0 and step.info["blocked_requests"] == []


@pytest.mark.parametrize("name", EXPERT_TASKS)
def test_scripted_solver_reaches_reward_one(env, name):
    for seed in (0, 1):
        step = play_expert(env, wob(name, seed))
        assert step.done and step.reward == 1.0 and step.info["success"] and step.info["raw_reward"] > 0


def test_wrong_click_ends_with_reward_zero(env):
    obs = env.reset(wob("click-button", 5))
    right = env.expert_action()
    wrong = next(n for n in obs.data["axtree"] if n["role"] == "button" and f"click({n['id']})" != right and
                 n["name"] != next(m["name"] for m in obs.data["axtree"] if f"click({m['id']})" == right))
    step = env.step(f"click({wrong['id']})")
    assert step.done and step.reward == 0.0 and not step.info["success"] and step.info["raw_reward"] < 0


def test_click_xy_uses_the_viewport_grid(env):
    obs = env.reset(wob("click-button", 7))
    target = int(env.expert_action()[6:-1])
    x0, y0, x1, y1 = next(n["box"] for n in obs.data["axtree"] if n["id"] == target)
    step = env.step(f"click_xy({(x0 + x1) / 2}, {(y0 + y1) / 2})")
    assert step.info["valid"] and step.done and step.reward == 1.0


def test_same_seed_same_episode(env):
    seen = []
    for _ in range(3):
        for name in ("click-checkboxes", "login-user"):
            obs = env.reset(wob(name, 11))
            seen.append((name, obs.data["instruction"], env.normalize(obs.text)))
        env.reset(wob("click-checkboxes", 12))      # another episode in between must not leak
    by_task = {name: {(u, t) for n, u, t in seen if n == name} for name in ("click-checkboxes", "login-user")}
    assert all(len(v) == 1 for v in by_task.values()), by_task
    other = env.reset(wob("click-checkboxes", 12))
    assert env.normalize(other.text) != next(iter(by_task["click-checkboxes"]))[1]


def test_ids_stay_stable_across_steps(env):
    obs = env.reset(wob("enter-text", 2))
    before = {n["id"]: (n["role"], n.get("name")) for n in obs.data["axtree"] if n["id"] is not None}
    step = env.step(env.expert_action())                      # type(...)
    after = {n["id"]: (n["role"], n.get("name")) for n in step.obs.data["axtree"] if n["id"] is not None}
    assert before == after and 'value="' + env._utterance.split('"')[1] + '"' in step.obs.text


@pytest.mark.parametrize("action, why", [
    ("I think I should click the button", "no action found"),
    ("click(999)", "no element [999]"),
    ("click(submit)", "element id"),
    ("type(1)", "2 argument"),
    ('select(1, "x")', "not a select box"),
    ('press("NoSuchKey")', "unknown key"),
    ("scroll(left)", "up or down"),
    ("click_xy(2000, 10)", "0-1000"),
    ('answer("done")', "web tasks"),
])
def test_malformed_actions_are_invalid_not_errors(env, action, why):
    env.reset(wob("click-checkboxes", 4))
    step = env.step(action)
    assert step.info["valid"] is False and not step.done and step.reward == 0.0
    assert why in step.obs.text and "Task: " in step.obs.text


def test_step_limit_ends_the_episode(env):
    env.step_limit = 2
    try:
        env.reset(wob("click-checkboxes", 0))
        assert not env.step("scroll(down)").done
        last = env.step("scroll(up)")
        assert last.done and last.info["truncated"] and last.reward == 0.0
        after = env.step("scroll(up)")
        assert after.done and after.info["valid"] is False and "episode is over" in after.obs.text
    finally:
        env.step_limit = 15


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    hits: list = []
    def do_GET(self):
        self.hits.append(self.path)
        self.send_response(200); self.send_header("Access-Control-Allow-Origin", "*"); self.end_headers()
        self.wfile.write(b"secret")
    def log_message(self, *a): pass


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    other = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _CountingHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    other_url = f"http://127.0.0.2:{other.server_address[1]}"
    root = tmp_path_factory.mktemp("site")
    (root / "local.txt").write_text("local data")
    (root / "index.html").write_text(f"""<!doctype html><html><head><title>Allowlist test</title></head><body>
<img src="{other_url}/pixel.png" alt="pixel">
<p id="out">waiting</p>
<button onclick="fetch('{other_url}/x').then(r => r.text()).then(t => out.textContent = 'got ' + t).catch(e => out.textContent = 'fetch failed')">Fetch other</button>
<button onclick="fetch('/local.txt').then(r => r.text()).then(t => out.textContent = 'got ' + t)">Fetch local</button>
<select id="s"><option>red</option><option>green</option></select>
</body></html>""")
    site = StaticSite(root)
    yield site, other_url, _CountingHandler.hits
    site.close(); other.shutdown()


def _button(obs, name):
    return next(n["id"] for n in obs.data["axtree"] if n["role"] == "button" and n["name"] == name)


def test_allowlist_blocks_and_records_other_hosts(web, sites):
    site, other_url, hits = sites
    hits.clear()
    task = Task(id="web/allow", env="web", config={"url": site.url("index.html")})
    obs = web.reset(task)
    assert obs.text.startswith("Allowlist test\n" + site.url("index.html"))
    step = web.step(f"click({_button(obs, 'Fetch local')})")
    assert step.info["valid"] and 'text "got local data"' in step.obs.text
    step = web.step(f"click({_button(obs, 'Fetch other')})")
    step = web.step(f"select({next(n['id'] for n in obs.data['axtree'] if n['role'] == 'combobox')}, \"green\")")
    assert 'text "fetch failed"' in step.obs.text and 'value="green"' in step.obs.text
    blocked = [b["url"] for b in step.info["blocked_requests"]]
    assert f"{other_url}/pixel.png" in blocked and f"{other_url}/x" in blocked
    assert hits == [], "a blocked request reached the other host"
    # control: with the other host on the allowlist the same page does reach it
    obs = web.reset(Task(id="web/allow2", env="web", config={"url": site.url("index.html"),
                                                             "allowed_hosts": [site.host, other_url[7:]]}))
    step = web.step(f"click({_button(obs, 'Fetch other')})")
    assert 'text "got secret"' in step.obs.text and "/x" in hits and step.info["blocked_requests"] == []


def test_web_answer_ends_episode_and_screenshot(web, sites):
    site, _, _ = sites
    web.screenshot = True
    try:
        obs = web.reset(Task(id="web/answer", env="web", instruction="What colour?", config={"url": site.url("index.html")}))
        assert obs.image[:8] == b"\x89PNG\r\n\x1a\n" and obs.data["instruction"] == "What colour?"
        step = web.step('answer("red")')
        assert step.done and step.info["answer"] == "red" and step.reward == 0.0
    finally:
        web.screenshot = False


def test_task_lists_and_errors(monkeypatch):
    train = list_tasks("miniwob", "train", tasks=["click-button", "enter-text"], seeds_per_task=4)
    test = list_tasks("miniwob", "test", tasks=["click-button", "enter-text"], seeds_per_task=4)
    assert [t.id for t in train[:2]] == ["miniwob/click-button/0", "miniwob/click-button/1"]
    assert not {t.id for t in train} & {t.id for t in test}
    with pytest.raises(ValueError, match="task file"): list_tasks("web")
    monkeypatch.setenv("LABMOD_CHROMIUM_PATH", "/nonexistent/chromium")
    with BrowserEnv("miniwob") as e, pytest.raises(MissingDependency, match="apt-get install chromium"):
        e.reset(wob("click-button"))
