"EnvPool with real TextWorld-Express workers: parallel results, SIGKILL recovery, timeouts."
import os, signal, time
import pytest
from labmod.envs.core import EnvError, list_tasks, make_env
from labmod.envs.pool import EnvPool, PooledEnv
from labmod.envs.twx import twx_task


def gold_episode(env, task):
    "Observations, rewards and infos of one episode along the gold path."
    out = [env.reset(task).text]
    while (a := env.expert_action()) is not None:
        s = env.step(a)
        out.append((s.obs.text, s.reward, s.done, s.info["success"]))
    return out


@pytest.fixture(scope="module")
def pool():
    with EnvPool("textworld_express", 2, env_kwargs={"step_limit": 40}, step_timeout=30) as p:
        yield p


def test_parallel_workers_match_a_local_env(pool):
    tasks = list_tasks("textworld_express", "dev", games=["cookingworld", "mapreader", "sorting"], n_per_game=2)
    local = make_env("textworld_express", step_limit=40)
    try:
        expected = [gold_episode(local, t) for t in tasks]
    finally:
        local.close()
    # run the episodes two at a time, interleaving steps of both workers through futures
    got = [None] * len(tasks)
    for start in range(0, len(tasks), 2):
        batch = list(enumerate(tasks[start:start + 2]))
        hist = {w: [pool.submit(w, "reset", t).result().text] for w, t in batch}
        live = {w for w, _ in batch}
        while live:
            acts = {w: pool.submit(w, "expert_action") for w in live}
            futs = {w: pool.submit(w, "step", f.result()) for w, f in acts.items() if f.result() is not None}
            live = set(futs)
            for w, f in futs.items():
                s = f.result()
                hist[w].append((s.obs.text, s.reward, s.done, s.info["success"]))
        for w, t in batch: got[start + w] = hist[w]
    assert got == expected
    assert all(ep[-1][3] for ep in got)


def test_pooled_env_is_an_env(pool):
    env = PooledEnv(pool, 1)
    task = twx_task("coin", 3)
    ep = gold_episode(env, task)
    assert ep[-1][2] and ep[-1][3]
    assert env.valid_actions() == sorted(env.valid_actions())
    assert env.normalize("You SEE: a Coin.") == "you see a coin"


def test_sigkill_mid_episode_raises_env_error_then_worker_recovers(pool):
    task = twx_task("cookingworld", 5)
    pool.reset(0, task)
    pool.step(0, pool.expert_action(0))
    pid = pool.worker_pid(0)
    restarts = pool.restarts(0)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EnvError) as e:
        pool.step(0, "look around")
    assert "worker 0" in str(e.value) and "signal 9" in str(e.value)
    assert pool.restarts(0) == restarts + 1
    # the other worker was not touched
    assert pool.reset(1, twx_task("coin", 1)).text
    # after a new reset the restarted worker plays a full episode again
    ep = gold_episode(PooledEnv(pool, 0), task)
    assert ep[-1][3] and pool.worker_pid(0) != pid


def test_step_timeout_raises_env_error_instead_of_hanging():
    # the package-default cookingworld (11 rooms, gold path generated) takes far longer than 1 ms to reset
    big = twx_task("cookingworld", 0, params="")
    with EnvPool("textworld_express", 1, step_timeout=0.001) as tiny:
        t = time.monotonic()
        with pytest.raises(EnvError, match="worker 0: reset timed out"):
            tiny.reset(0, big)
        assert time.monotonic() - t < 15
        assert tiny.restarts(0) == 1
        # the restarted worker serves the same call given a sane per-call timeout
        assert tiny.call(0, "reset", big, timeout=60).text


def test_env_exceptions_pass_through_and_keep_the_worker(pool):
    pid = pool.worker_pid(1)
    with pytest.raises(ValueError, match="unknown TextWorld-Express game"):
        pool.reset(1, twx_task("coin", 1).__class__("x", "textworld_express", config={"game": "chess", "seed": 1}))
    assert pool.worker_pid(1) == pid


def test_missing_env_fails_fast():
    with EnvPool("no_such_env", 1, start_timeout=60) as p:
        with pytest.raises(KeyError, match="unknown env"):
            p.reset(0, twx_task("coin", 1))
