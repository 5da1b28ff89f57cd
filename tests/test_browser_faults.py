"""The browser env under faults and bad input: a renderer or browser killed mid-episode (the next reset works),
episodes that leave state behind (the same task and seed replay the same, whatever ran before), and malformed
actions of every shape (an invalid action, in linear time, never an exception)."""
import signal, socket, threading, time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from labmod.core import Task
from labmod.envs.browser import ACTION_ARITY, ActionError, BrowserEnv, BrowserTimeouts, StaticSite, parse_command
from labmod.envs.core import EnvError


def wob(task: str, seed: int) -> Task:
    return Task(id=f"miniwob/{task}/{seed}", env="miniwob", config={"task": task, "seed": seed})


def chromium_processes() -> list[psutil.Process]:
    "Our Chromium processes (descendants of this test process)."
    return [p for p in psutil.Process().children(recursive=True) if p.name().startswith("chromium")]


def browser_of(env: BrowserEnv, started_before: set[int]) -> psutil.Process:
    "The main Chromium process of `env` (started after `started_before` was taken)."
    mains = [p for p in chromium_processes() if p.pid not in started_before and "--type=" not in " ".join(p.cmdline())]
    assert len(mains) == 1, [p.cmdline()[:2] for p in mains]
    return mains[0]


def renderers(browser: psutil.Process) -> list[psutil.Process]:
    return [p for p in browser.children(recursive=True) if "--type=renderer" in " ".join(p.cmdline())]


def play(env, task: Task, actions: list[str]) -> tuple[str, list]:
    "The initial observation and (action, reward, done, valid) per step."
    obs, out = env.reset(task), []
    for a in actions:
        s = env.step(a)
        out.append((a, s.reward, s.done, s.info["valid"]))
        if s.done: break
    return obs.text, out


def test_a_crashed_renderer_is_replaced_at_the_next_reset():
    before = {p.pid for p in chromium_processes()}
    with BrowserEnv("miniwob", step_limit=10) as env:
        env.reset(wob("click-button", 0))
        browser = browser_of(env, before)
        assert env.step("scroll(down)").info["valid"]
        for r in renderers(browser): r.send_signal(signal.SIGKILL)     # mid-episode, as an OOM kill would
        time.sleep(0.5)
        with pytest.raises(EnvError, match="crash"):
            env.step("scroll(down)")
        for seed in (1, 2):    # every later reset works (it failed "Target crashed" for good), in the same browser
            obs = env.reset(wob("click-button", seed))
            step = env.step(env.expert_action())
            assert step.done and step.reward == 1.0, obs.text
        assert browser.is_running()
        # the whole browser killed mid-episode: the next reset starts a new one
        browser.send_signal(signal.SIGKILL); browser.wait(10)
        with pytest.raises(EnvError):
            env.step("scroll(down)")
        env.reset(wob("click-button", 3))
        assert env.step(env.expert_action()).reward == 1.0


# (task, seed, what the agent does in the replayed episode, what another episode leaves behind)
LEAK_CASES = [
    ("use-autocomplete", 7, ['type(2, "Latv")', "click(3)"], ['type(2, "A")', "scroll(down)"]),
    ("enter-text", 3, ["click(1)", "scroll(down)"], ['type(1, "leftover")']),
    ("click-checkboxes", 5, ["click(1)"], ["click(1)", "click(2)"]),
]


def test_the_same_task_and_seed_replay_the_same_whatever_ran_before():
    with BrowserEnv("miniwob", step_limit=10) as env:   # the reference: each task's first episode in a new env
        fresh = {task: play(env, wob(task, seed), actions) for task, seed, actions, _ in LEAK_CASES}
    with BrowserEnv("miniwob", step_limit=10) as env:
        for task, seed, actions, dirt in LEAK_CASES:
            play(env, wob(task, seed + 1), dirt)    # another episode of the same task, left as it ends
            assert play(env, wob(task, seed), actions) == fresh[task], task
    assert fresh["use-autocomplete"][1][-1][1:3] == (1.0, True)     # the replay of the reference still earns its reward


def test_web_episodes_keep_no_cookies_or_storage(tmp_path):
    "A web page that remembers itself (cookie, localStorage, sessionStorage) starts blank in every episode."
    (tmp_path / "s.html").write_text("<title>s</title><p id=o></p><script>o.textContent = 'seen: ' + (localStorage.getItem('k') || '-') + ' '"
                                     " + (document.cookie || '-') + ' ' + (sessionStorage.getItem('s') || '-');"
                                     " localStorage.setItem('k', 'L'); sessionStorage.setItem('s', 'S'); document.cookie = 'c=C';</script>")
    site = StaticSite(tmp_path)
    try:
        with BrowserEnv("web") as web:
            texts = [web.reset(Task(id="web/s", env="web", config={"url": site.url("s.html")})).text for _ in range(2)]
    finally: site.close()
    assert 'text "seen: - - -"' in texts[0] and texts[1] == texts[0], texts


def test_a_page_that_never_finishes_loading_is_observed_as_it_is(tmp_path):
    "A subresource whose server never answers holds the load event forever: reset shows the page and says so, in load_ms."
    hang = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: [held.append(hang.accept()) for _ in range(8)], daemon=True).start()
    port = hang.getsockname()[1]
    (tmp_path / "hang.html").write_text(f"<title>h</title><p>visible text</p><img src='http://127.0.0.1:{port}/x.png' alt=i>")
    (tmp_path / "fine.html").write_text("<title>f</title><p>visible text</p>")
    site = StaticSite(tmp_path)
    try:
        with BrowserEnv("web", timeouts=BrowserTimeouts(load_ms=2000)) as web:
            allowed = [site.host, f"127.0.0.1:{port}"]
            t0 = time.monotonic()
            hung = web.reset(Task(id="web/hang", env="web", config={"url": site.url("hang.html"), "allowed_hosts": allowed}))
            waited = time.monotonic() - t0
            fine = web.reset(Task(id="web/fine", env="web", config={"url": site.url("fine.html"), "allowed_hosts": allowed}))
    finally: site.close(); hang.close()
    assert held, "the browser never reached the hanging server, so this test tested nothing"
    assert hung.text.startswith("The page had not finished loading after 2 s") and 'text "visible text"' in hung.text, hung.text
    assert waited < 30, waited
    assert "not finished loading" not in fine.text and 'text "visible text"' in fine.text, fine.text


def test_parse_command_pathological_inputs_are_action_errors_in_linear_time():
    for text in ["click(" + "-" * 10_000, "click(" + "-" * 10_000 + "1)", "click_xy(" + "-" * 500 + "1, 2)", 'click("²")', "click(²)", "click(" + "(" * 5_000,
                 "click(" * 20_000, "answer(" * 20_000, 'type(1, "' * 20_000, "click(" + "[" * 20_000, "click(1" + "1" * 5_000 + ")",
                 "click_xy(" + "9" * 100_000 + ", 1)", "click(\ud800)", "\x00" * 1000, 12, None, b"click(1)"]:
        t0 = time.perf_counter()
        with pytest.raises(ActionError):
            parse_command(text)
        assert time.perf_counter() - t0 < 1.0, (str(text)[:20], time.perf_counter() - t0)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(ACTION_ARITY)), st.text(alphabet=st.characters(exclude_categories=()), max_size=40),
       st.sampled_from(["", "-", "(", "[", '"', "'", "\\", ",", "²", " ", "click("]), st.integers(0, 3000),
       st.sampled_from(["", ")", '")', "1)", "]), 2)"]))
def test_fuzzed_commands_only_raise_action_errors(verb, rest, filler, n, close):
    text = verb + "(" + filler * n + rest + close
    try: verb2, args = parse_command(text)
    except ActionError: return
    assert verb2 in ACTION_ARITY and len(args) == len(ACTION_ARITY[verb2])


@pytest.fixture(scope="module")
def env():
    e = BrowserEnv("miniwob", step_limit=1000)
    yield e
    e.close()


BAD_ACTIONS = {   # action -> must it be an invalid action (None: either; it must just not raise)
    "click(" + "-" * 10_000: True, "click(" + "-" * 10_000 + "1)": True, "click_xy(" + "-" * 500 + "1, 2)": True, 'click("²")': True, "answer(" * 5000: True,
    "press(" + "A" * 5000 + ")": True, "click_xy(1e400, 1)": True, "select(1, '\ud800')": True, "": True, None: True, 42: True,
    'type(1, "\ud800\udfff x")': None, 'type(1, "' + "x" * 20_000 + '")': False, 'press("\x00")': None}


def test_malformed_actions_are_invalid_steps(env):
    env.reset(wob("enter-text", 1))
    for action, invalid in BAD_ACTIONS.items():     # one episode: an invalid action changes nothing
        t0 = time.perf_counter()
        step = env.step(action)
        assert time.perf_counter() - t0 < 10, repr(action)[:40]
        assert not step.done and step.reward == 0.0 and "Task: " in step.obs.text, repr(action)[:40]
        if invalid is not None: assert step.info["valid"] == (not invalid), (repr(action)[:40], step.obs.text[:300])
        assert len(step.obs.text.split("Task: ")[0]) < 1000, "the note quotes the whole action"
