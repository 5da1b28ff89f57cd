"""WebGym's agent side on real served documentation sites in real Chromium: REINFORCE and GRPO updates with the
rubric reward through rl.train_loop, unchanged-page steps left out of REINFORCE samples, the evaluation queue
against inline judging, and a browser worker killed mid-batch.

Needs two of the Debian documentation packages (postgresql-doc-15 git-doc sqlite3-doc python3.11-doc) and chromium.
Run: .venv/bin/pytest tests/test_webgym_train.py -s"""
import os, signal, threading, time
import pytest
import torch
from labmod.webgym.websites import DEFAULT_SITES, SITES, installed_sites, serve_sites
from labmod.webgym.rubric import generate_tasks
from labmod.webgym.evaluator import evaluate_rubric
from labmod.agent import Agent
from labmod.models import load_lm
from labmod.rollout import RolloutConfig
from labmod import rl
from labmod.webgym.train import (EvalQueue, WebRolloutEngine, WebTaskEnv, web_env_factory, browser_pool, web_expert_trajectories,
                           tokenize_demos, train_webgym, WebGymConfig, webgym_samples)

NAMES = installed_sites(DEFAULT_SITES)[:2]
pytestmark = pytest.mark.skipif(len(NAMES) < 2, reason="needs 2 of the Debian packages: apt-get install -y "
                                + " ".join(SITES[n].package for n in DEFAULT_SITES))


@pytest.fixture(scope="module")
def sites():
    return serve_sites(NAMES)


@pytest.fixture(scope="module")
def tasks():
    # single-page tasks first: the expert needs one or two clicks, so each episode is short
    ts = generate_tasks(NAMES, tasks_per_site=3, seed=0, max_pages=20)
    return sorted(ts, key=lambda t: len(t.rubric["groups"]))[:3]


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return load_lm("tiny", seed=0)


def _cfg(algorithm, **kw):
    return WebGymConfig(algorithm=algorithm, template="task", history_k=0, steps=1, groups_per_step=1, group_size=2,
                        max_turns=2, n_envs=2, max_new_tokens=8, eval_every=0, expert_in_groups=True,
                        grpo=rl.GRPOConfig(lr=1e-4, micro_batch_size=2), **kw)


@pytest.mark.parametrize("algorithm", ["reinforce", "grpo"])
def test_update_through_train_loop(sites, tasks, lm, algorithm):
    before = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    res = train_webgym(lm, sites, tasks[:1], tasks[:1], _cfg(algorithm), progress=False)
    h = res["history"][0]
    assert not h.get("skipped_update"), h
    assert h["trajectories"] == 3 and 0 < h["success"] <= 1    # 2 policy rollouts + the expert's successful trace
    changed = sum(not torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    assert changed > 0, f"{algorithm}: no weight changed"
    assert len(res["curve"]) == 2 and all(0 <= c["success"] <= 1 for c in res["curve"])


def test_unchanged_page_steps_left_out_of_reinforce(sites, tasks, lm):
    agent = Agent(lm, template="task", history_k=0)
    env = web_env_factory(sites)()
    try:
        task = tasks[0]
        env.reset(task)
        st = env.step("scroll(down)")              # the accessibility tree covers the whole page: nothing changes
        assert st.info["page_unchanged"] and st.info["repetition_penalty"] == 0.1
        demo = web_expert_trajectories(agent, env, [task])[0]
    finally: env.close()
    assert demo.success
    # the expert's episode with the no-op scroll in front of it (same env, same page signature rule)
    env = web_env_factory(sites)()
    try:
        obs = env.reset(task); st = env.step("scroll(down)")
        from labmod.core import Turn
        scroll = Turn(prompt=demo.turns[0].prompt, completion="<action>scroll(down)</action>", action="scroll(down)", obs=st.obs,
                      info=dict(st.info))
    finally: env.close()
    demo.turns.insert(0, scroll)
    tokenize_demos(agent, [demo])
    kept = webgym_samples(_cfg("reinforce"))([[demo]])
    assert [s.meta["turn"] for s in kept] == list(range(1, len(demo.turns)))
    no_penalty = webgym_samples(_cfg("reinforce", repetition_penalty=0.0))([[demo]])
    assert [s.meta["turn"] for s in no_penalty] == list(range(len(demo.turns)))


def test_eval_queue_matches_inline(sites, tasks, lm):
    agent = Agent(lm, template="task", history_k=0, max_new_tokens=8)
    with EvalQueue(2) as q:
        env = web_env_factory(sites, eval_queue=q)()
        try: queued = web_expert_trajectories(agent, env, tasks)
        finally: env.close()
        assert all("pending_eval" in d.turns[-1].info for d in queued)
        assert q.resolve(queued) == len(tasks)
        # policy rollouts (mostly failures) through the engine with the queue
        eng = WebRolloutEngine(agent, web_env_factory(sites, eval_queue=q), RolloutConfig(max_turns=2, n_envs=2, seed=0,
                                                                                         show_valid_actions=False), q)
        try: groups = eng.run(tasks[:2], group_size=2)
        finally: eng.close()
    env = web_env_factory(sites)()       # inline judging
    try: inline = web_expert_trajectories(agent, env, tasks)
    finally: env.close()
    assert [d.turns[-1].reward for d in queued] == [d.turns[-1].reward for d in inline] == [1.0] * len(tasks)
    assert [d.turns[-1].info["rubric_verdict"] for d in queued] == [d.turns[-1].info["rubric_verdict"] for d in inline]
    for tr in (t for g in groups for t in g):
        assert not any("pending_eval" in t.info for t in tr.turns)
        if tr.turns and "rubric_verdict" in tr.turns[-1].info:
            assert tr.turns[-1].info["rubric_verdict"]["reward"] == evaluate_rubric(tr).reward


def test_killed_browser_worker_is_restarted(sites, tasks, lm):
    agent = Agent(lm, template="task", history_k=0, max_new_tokens=8)
    pool = browser_pool(sites, 2)
    try:
        pid = pool.worker_pid(0)
        eng = WebRolloutEngine(agent, web_env_factory(sites, pool=pool, step_limit=3),
                               RolloutConfig(max_turns=3, n_envs=2, seed=0, show_valid_actions=False, episode_retries=2))
        killed = threading.Event()
        def kill_when_busy():
            # wait until the batch is under way (the engine's first env calls), then kill worker 0's browser process
            deadline = time.time() + 60
            while time.time() < deadline and eng.stats.turns + eng.stats.episodes == 0 and eng.stats.env_busy_s == 0: time.sleep(0.05)
            os.kill(pid, signal.SIGKILL); killed.set()
        threading.Thread(target=kill_when_busy, daemon=True).start()
        try: groups = eng.run(tasks * 2, group_size=1)
        finally: eng.close()
        assert killed.is_set()
        trajs = [t for g in groups for t in g]
        assert len(trajs) == 2 * len(tasks) and all(g for g in groups)
        assert not any("env_error" in t.metadata for t in trajs), [t.metadata for t in trajs]
        assert eng.stats.env_errors >= 1 and pool.restarts(0) >= 1 and pool.worker_pid(0) != pid
    finally: pool.close()
