"""WebGym's agent side on real served documentation sites in real Chromium: REINFORCE and GRPO updates with the
rubric reward through `train_webgym` (the one training run, `rl.run.train`), the warm start in the memory format
(and its sharing across arms), unchanged-page turns left out of REINFORCE samples, the evaluation queue against inline
judging, and a browser worker killed mid-batch.

Needs two of the Debian documentation packages (postgresql-doc-15 git-doc sqlite3-doc python3.11-doc) and chromium.
Run: .venv/bin/pytest tests/test_webgym_train.py -s"""
import dataclasses, os, signal, threading
import pytest
import torch
from labmod.core import Trajectory
from labmod.envs.core import EnvWrapper
from labmod.webgym.websites import DEFAULT_SITES, SITES, installed_sites, serve_sites
from labmod.webgym.rubric import generate_tasks
from labmod.webgym.evaluator import EvalQueue, evaluate_rubric, rubric_judge
from labmod.webgym.env import web_env_factory, browser_pool
from labmod.webgym.train import MEMORY_FORMAT, WebGymConfig, WebGymHooks, train_webgym, compare_arms, web_envs
from labmod.agent import Agent, ExpertPolicy, TASK_FORMAT
from labmod.models import load_lm
from labmod.rollout import RolloutEngine, RolloutConfig
from labmod.rl import GRPOConfig, ReinforceConfig, RunConfig, RunTasks, WarmStart
from labmod.rl.run import make_samples, make_trainer, demonstrations, sft_examples
from labmod.lab.experiment import Run

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


def _cfg(algo, **kw):
    run = RunConfig(steps=1, groups_per_step=1, group_size=2, max_turns=2, n_envs=2, eval_every=0, dynamic_sampling=False,
                    progress=False, algo=algo)
    return WebGymConfig(run=run, format=TASK_FORMAT, history_k=0, max_new_tokens=None, expert_in_groups=True, **kw)   # fitted to the answers


@pytest.mark.parametrize("algo", [ReinforceConfig(lr=1e-4, micro_batch_size=2), GRPOConfig(lr=1e-4, micro_batch_size=2)],
                         ids=["reinforce", "grpo"])
def test_update_through_the_training_run(sites, tasks, lm, algo):
    before = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    res = train_webgym(lm, sites, RunTasks(tasks[:1], tasks[1:2]), _cfg(algo))
    h = res["history"][0]
    assert not h.get("skipped_update"), h
    assert h["trajectories"] == 3 and 0 < h["success"] <= 1    # 2 policy rollouts + the expert's successful trace
    changed = sum(not torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    assert changed > 0, f"{type(algo).__name__}: no weight changed"
    assert [c["update"] for c in res["curve"]] == [0, 1] and all(0 <= c["success"] <= 1 for c in res["curve"])
    assert res["effective_updates"] == 1 and res["hooks"]["expert_traces_in_groups"] == 1 and res["hooks"]["episodes_judged"] >= 4


def _memory_cfg(**kw):
    run = RunConfig(steps=0, max_turns=6, n_envs=1, progress=False, warm=WarmStart(epochs=1, lr=2e-3, batch_size=1))
    return WebGymConfig(run=run, format=MEMORY_FORMAT, history_k=0, max_new_tokens=None, sft_turns="click", **kw)


def test_warm_start_in_the_memory_format(sites, tasks, lm):
    cfg = _memory_cfg()
    agent = cfg.make_agent(lm, tasks)
    with web_envs(sites, cfg) as factory:
        demos = WebGymHooks(cfg).demos(demonstrations(agent, factory, tasks[:1], "expert", cfg.run.max_turns))
    (demo,) = demos
    clicks = [t for t in demo.turns if t.action.startswith("click(")]
    assert demo.success and clicks and demo.turns[-1].action.startswith("answer(")
    assert clicks[0].completion.startswith("<memory>visited: none</memory><progress>0 of ")
    assert "Your memory so far: visited: none" in demo.turns[1].prompt[1]["content"]      # the expert's memory comes back
    examples = sft_examples(agent, demos)                                               # click turns only, within the fitted budget
    assert [c for _, c in examples] == [t.completion_ids for t in clicks]
    before = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    res = train_webgym(lm, sites, RunTasks(tasks[1:2], tasks[2:3], warm=tasks[:1]), cfg)
    assert res["warm"]["demo_success"] == 1.0 and res["warm"]["examples"] == len(clicks) and res["effective_updates"] == 0
    assert any(not torch.equal(before[k], v) for k, v in lm.model.state_dict().items()), "the warm start changed no weight"


def test_compare_arms_shares_one_warm_start(sites, tasks, tmp_path):
    lms = []
    def load(seed):
        lms.append(load_lm("tiny", seed=seed)); return lms[-1]
    arms = {"rubric": _memory_cfg(), "task-only": _memory_cfg(train_judge="task_only"), "no penalty": _memory_cfg(repetition_penalty=0.0)}
    run = Run(tmp_path, {})
    curves, _ = compare_arms(arms, load, sites, RunTasks(tasks[1:2], tasks[2:3], warm=tasks[:1]), [0], run=run)
    assert [c["arm"] for c in curves] == list(arms) and all(c["update"] == 0 for c in curves)
    assert len([r for r in run.store.metrics() if "warm_start" in r]) == 1       # neither the judge nor the penalty is part of the warm start
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)
    rubric, task_only, no_penalty = (m.model.state_dict() for m in lms)
    assert same(rubric, task_only) and same(rubric, no_penalty)
    assert not same(rubric, load_lm("tiny", seed=0).model.state_dict()), "the arms did not start from the warm start"


class ScrollFirst(ExpertPolicy):
    "The env's expert, after a scroll that leaves the page as it is."
    name = "scroll-then-expert"
    def choose(self, s, rng): return "scroll(down)" if s.step == 0 else s.expert_action


def test_unchanged_page_turns_left_out_of_reinforce(sites, tasks, lm):
    agent = Agent(lm, format=TASK_FORMAT, history_k=0, max_new_tokens=64)
    with RolloutEngine(ScrollFirst(agent), web_env_factory(sites, penalty=0.1), RolloutConfig(max_turns=8, n_envs=1)) as eng:
        (demo,), = eng.run(tasks[:1], scorer=rubric_judge)
    scroll, *rest = demo.turns
    assert demo.success and scroll.info["page_unchanged"] and scroll.info["reward_penalty"] == 0.1
    assert scroll.reward == -0.1 and not any(t.info["page_unchanged"] for t in rest)    # the engine charged the penalty
    trainer = make_trainer(lm.model, lm.tokenizer, ReinforceConfig())
    copy = Trajectory.from_json(demo.to_json())     # before the hooks mark the scroll
    kept = make_samples(trainer, WebGymHooks(_cfg(ReinforceConfig())).groups(tasks[:1], [[demo]]))
    assert [s.meta["turn"] for s in kept] == list(range(1, len(demo.turns))) and scroll.info["train"] is False
    no_penalty = make_samples(trainer, WebGymHooks(_cfg(ReinforceConfig(), repetition_penalty=0.0)).groups(tasks[:1], [[copy]]))
    assert [s.meta["turn"] for s in no_penalty] == list(range(len(copy.turns)))


def test_eval_queue_matches_inline(sites, tasks, lm):
    expert = ExpertPolicy(Agent(lm, format=TASK_FORMAT, history_k=0, max_new_tokens=64))
    policy = Agent(lm, format=TASK_FORMAT, history_k=0, max_new_tokens=8)
    cfg = RolloutConfig(max_turns=6, n_envs=2, seed=0, show_valid_actions=False)
    with EvalQueue(2) as q:
        with RolloutEngine(expert, web_env_factory(sites), cfg) as eng:
            queued = [g[0] for g in eng.run(tasks, scorer=q.scorer())]
            inline = [g[0] for g in eng.run(tasks, scorer=rubric_judge)]
        with RolloutEngine(policy, web_env_factory(sites), cfg) as eng:     # policy rollouts, mostly failures
            groups = eng.run(tasks[:2], group_size=2, scorer=q.scorer())
        assert q.judged == len(tasks) + 4     # the inline run judged without the queue
    assert [d.turns[-1].reward for d in queued] == [d.turns[-1].reward for d in inline] == [1.0] * len(tasks)
    assert [d.turns[-1].info["verdict"] for d in queued] == [d.turns[-1].info["verdict"] for d in inline]
    for tr in (t for g in groups for t in g):
        assert tr.turns and tr.turns[-1].info["verdict"]["reward"] == evaluate_rubric(tr).reward


class Signal(EnvWrapper):
    "Sets `started` when its env is reset: the batch is under way."
    started = threading.Event()
    def reset(self, task):
        Signal.started.set(); return self.inner.reset(task)


def test_killed_browser_worker_is_restarted(sites, tasks, lm):
    agent = Agent(lm, format=TASK_FORMAT, history_k=0, max_new_tokens=8)
    pool = browser_pool(sites, 2)
    try:
        pid = pool.worker_pid(0)
        factory = web_env_factory(sites, pool=pool, step_limit=3)
        eng = RolloutEngine(agent, lambda: Signal(factory()), RolloutConfig(max_turns=3, n_envs=2, seed=0, show_valid_actions=False,
                                                                            episode_retries=2))
        killed = threading.Event()
        def kill_when_busy():
            # wait until the batch is under way (an env's first reset), then kill worker 0's browser process
            if Signal.started.wait(60): os.kill(pid, signal.SIGKILL); killed.set()
        threading.Thread(target=kill_when_busy, daemon=True).start()
        try: groups = eng.run(tasks * 2, group_size=1)
        finally: eng.close()
        assert killed.is_set()
        trajs = [t for g in groups for t in g]
        assert len(trajs) == 2 * len(tasks) and all(g for g in groups)
        assert not any("env_error" in t.metadata for t in trajs), [t.metadata for t in trajs]
        assert eng.stats.env_errors >= 1 and eng.stats.lost_episodes == 0 and pool.restarts(0) >= 1 and pool.worker_pid(0) != pid
    finally: pool.close()


def test_action_budget_fits_the_answer_turns(sites, tasks, lm):
    "Issue 21: a 16-token budget cannot hold the expert's answer turn: a clear error naming the setting; the fitted budget can."
    run = RunConfig(steps=0, max_turns=6, n_envs=1, progress=False, warm=WarmStart(epochs=1, lr=2e-3, batch_size=1))
    old = WebGymConfig(run=run, format=TASK_FORMAT, history_k=0, max_new_tokens=16)
    with pytest.raises(ValueError, match=r"WebGymConfig\.max_new_tokens=16 cannot hold the expert's answer turn"):
        train_webgym(lm, sites, RunTasks(tasks[1:2], tasks[2:3], warm=tasks[:1]), old)
    fitted = dataclasses.replace(old, max_new_tokens=None)
    agent = fitted.make_agent(lm, tasks)
    with web_envs(sites, fitted) as factory:
        demos = WebGymHooks(fitted).demos(demonstrations(agent, factory, tasks, "expert", run.max_turns))
    answers = [t for d in demos for t in d.turns if t.action.startswith("answer(")]
    assert len(answers) == len(tasks) and all(d.success for d in demos)
    assert agent.max_new_tokens == max(len(t.completion_ids) for t in answers) > 16     # the longest answer turn, exactly
    assert len(sft_examples(agent, demos)) == sum(len(d.turns) for d in demos)          # the warm start trains on the answers too
    res = train_webgym(lm, sites, RunTasks(tasks[1:2], tasks[2:3], warm=tasks[:1]), fitted)
    assert res["warm"]["examples"] == len(demos[0].turns) and res["effective_updates"] == 0
