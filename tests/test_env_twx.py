"TextWorld-Express adapter against the real simulator (one JVM for the module)."
import pytest
from labmod.envs.core import list_tasks, make_env
from labmod.envs.twx import TWX_GAMES, TextWorldExpressEnv, seed_folds, twx_task


@pytest.fixture(scope="module")
def env():
    e = make_env("textworld_express", step_limit=60)
    yield e
    e.close()


def test_game_list_matches_package(env):
    assert sorted(env._sim.getGameNames()) == sorted(TWX_GAMES)


def test_seed_folds_are_official_and_disjoint():
    f = seed_folds()
    assert [len(f[s]) for s in ("train", "dev", "test")] == [1000, 1000, 1000]
    assert not (set(f["train"]) & set(f["dev"])) and not (set(f["dev"]) & set(f["test"]))
    ids = [t.id for t in list_tasks("textworld_express", "test", games=["sorting"], n_per_game=3)]
    assert ids == [f"textworld_express/sorting/test/{s}" for s in f["test"][:3]]


@pytest.mark.parametrize("game", TWX_GAMES)
def test_every_game_resets_steps_and_solves_along_gold_path(env, game):
    for split in ("train", "dev", "test"):
        task = list_tasks("textworld_express", split, games=[game], n_per_game=2)[1]
        obs = env.reset(task)
        assert obs.text and obs.data["instruction"]
        valid = env.valid_actions()
        assert valid and valid == sorted(valid)
        gold = env.gold_path()
        assert gold and env.expert_action() == gold[0]
        # a valid, non-gold step is accepted (and leaves the gold path unless it is the gold action)
        s = env.step(valid[0])
        assert s.info["valid"] and 0.0 <= s.reward <= 1.0
        env.reset(task)
        total, steps = 0.0, []
        while (a := env.expert_action()) is not None:
            steps.append(env.step(a))
            total += steps[-1].reward
        assert len(steps) == len(gold), f"{task.id}: gold path left after {len(steps)} of {len(gold)} steps"
        last = steps[-1]
        assert last.done and last.info["success"] and last.info["score"] == 1.0, task.id
        assert all(0.0 <= x.reward <= 1.0 and x.info["valid"] for x in steps)
        assert abs(total - 1.0) < 1e-9


def test_seed_replay_is_deterministic(env):
    for game in ("cookingworld", "mapreader", "simonsays"):
        task = twx_task(game, 17)
        runs = []
        for _ in range(3):
            obs = [env.normalize(env.reset(task).text)]
            while (a := env.expert_action()) is not None:
                obs.append(env.normalize(env.step(a).obs.text))
            runs.append(obs)
        assert runs[0] == runs[1] == runs[2]


def test_package_defaults_are_reachable(env):
    "params='' gives the package's own (large) world; it still solves along its gold path."
    env.reset(twx_task("cookingworld", 0, params=""))
    assert len(env.gold_path()) > 20


def test_closed_env_raises_env_error():
    from labmod.envs.core import EnvError
    e = TextWorldExpressEnv()
    e.close()
    with pytest.raises(EnvError):
        e.reset(twx_task("coin", 0))


def test_killed_jvm_heals_at_next_reset():
    "A JVM SIGKILLed mid-episode fails the step with EnvError; the next reset starts a new JVM and the env plays on."
    from labmod.envs.core import EnvError
    e = TextWorldExpressEnv()
    try:
        task = twx_task("coin", 2)
        e.reset(task); e.step(e.expert_action())
        jvm = e._sim._gateway.java_process
        jvm.kill(); jvm.wait()
        with pytest.raises(EnvError, match="JVM died"):
            e.step("look around")
        with pytest.raises(EnvError, match="reset\\(\\) starts a new one"):
            e.step("look around")
        e.reset(task)
        while (a := e.expert_action()) is not None: s = e.step(a)
        assert s.info["success"] and e._sim._gateway.java_process.pid != jvm.pid
    finally:
        e.close()
