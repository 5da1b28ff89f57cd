"""ALFWorld adapter on the lab's generated games: the planner's expert wins every task type, ALFWorld's own
loader plays the same games, replays are deterministic, invalid actions are reported, not raised."""
import json, random, time

import pytest

from labmod.core import Task
from labmod.envs.alfworld import AlfWorldEnv, alfworld_task, collect_game_files, list_alfworld_tasks
from labmod.envs.alfworld_games import TASK_TYPES, fast_textworld, generate_games


@pytest.fixture(scope="session")
def games(tmp_path_factory):
    "One generated train game per task type (generation is the slow part: done once per session)."
    root = tmp_path_factory.mktemp("alfworld")
    files = generate_games(root, "train", n=len(TASK_TYPES), seed=0, progress=False)
    return root, files


@pytest.fixture(scope="session")
def env():
    e = AlfWorldEnv(step_limit=50)
    yield e
    e.close()


def _task(game_file):
    return alfworld_task(game_file, "train")


def test_generated_games_follow_alfworld_layout(games):
    root, files = games
    assert sorted(f.parent.parent.name.split("-")[0] for f in files) == sorted(TASK_TYPES)
    for f in files:
        assert f.parts[-4:-2][0] == "train" and f.parent.name.startswith("trial_")
        assert (f.parent / "traj_data.json").is_file() and (f.parent / "initial_state.pddl").is_file()
        data = json.loads(f.read_text())
        assert data["solvable"] is True and data["walkthrough"]
    assert collect_game_files(root, "train") == sorted(files)


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_planner_expert_wins_each_task_type(games, env, task_type):
    _, files = games
    game = next(f for f in files if f.parent.parent.name.startswith(task_type + "-"))
    task = _task(game)
    assert task.metadata["task_type"] == task_type
    obs = env.reset(task)
    assert obs.data["instruction"] and "Your task is to:" in obs.text
    rewards = []
    for _ in range(40):
        act = env.expert_action()
        if act is None: break
        assert act in env.valid_actions()
        step = env.step(act)
        assert step.info["valid"] and step.info["expert_action"] == env.expert_action()
        rewards.append(step.reward)
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0
    assert step.done and step.info["success"] and step.info["score"] == 1.0


def test_alfworld_own_loader_plays_generated_games(games, env):
    """AlfredTWEnv (ALFWorld's loader and gym env) finds the games and wins with the stored walkthrough."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv
    root, files = games
    data = str(root / "json_2.1.1" / "train")
    config = {
        "env": {"goal_desc_human_anns_prob": 0.0, "task_types": [1, 2, 3, 4, 5, 6],
                "domain_randomization": False, "expert_type": "handcoded"},
        "dataset": {"data_path": data, "eval_id_data_path": data, "eval_ood_data_path": data,
                    "num_train_games": -1, "num_eval_games": -1},
        "logic": {"domain": "", "grammar": ""},
        "general": {"training_method": "dqn"},
        "rl": {"training": {"max_nb_steps_per_episode": 50}},
    }
    alf = AlfredTWEnv(config, train_eval="train")
    assert sorted(alf.game_files) == sorted(str(f) for f in files)
    gym_env = alf.init_env(batch_size=1)
    try:
        obs, infos = gym_env.reset()
        game_file = infos["extra.gamefile"][0]
        # the adapter shows the same opening text and the same admissible commands
        ours = env.reset(_task(game_file))
        assert obs[0] == ours.text and infos["admissible_commands"][0] == env.valid_actions()
        for cmd in json.loads(open(game_file).read())["walkthrough"]:
            assert not infos["won"][0]
            obs, scores, dones, infos = gym_env.step([cmd])
        assert infos["won"][0] and dones[0]
    finally:
        gym_env.close()


def fast_downward_pddl2sas():
    import fast_downward
    return fast_downward.pddl2sas


def test_replay_is_deterministic(games, env):
    _, files = games
    task = _task(files[0])
    env.reset(task)
    rng = random.Random(0)
    actions = []
    for _ in range(8):  # random admissible actions, then the expert's plan from there
        actions.append(rng.choice(env.valid_actions())); env.step(actions[-1])
    actions += env.expert_plan()

    def replay(e):
        out = [e.normalize(e.reset(task).text)]
        for a in actions: out.append(e.normalize(e.step(a).obs.text))
        return out

    first = replay(env)
    fresh = AlfWorldEnv()
    try:
        assert replay(env) == first and replay(fresh) == first
        fast_textworld(False)  # TextWorld without the lab's memoization reads the same
        plain = AlfWorldEnv()
        import textworld.envs.pddl.textgen as textgen
        assert not hasattr(fast_downward_pddl2sas(), "cache_info") and textgen._parse_and_convert.__name__ == "_parse_and_convert"
        assert replay(plain) == first
        plain.close()
    finally:
        fast_textworld(True)
        fresh.close()


def test_invalid_action_is_reported_not_raised(games, env):
    _, files = games
    env.reset(_task(files[1]))
    before = env.valid_actions()
    for bad in ["fly to the moon", "", "go to nowhere 99", "take"]:
        step = env.step(bad)
        assert step.info["valid"] is False and step.reward == 0.0 and not step.done
        assert step.obs.text == "Nothing happens."
    assert env.valid_actions() == before
    assert env.step(before[0].upper()).info["valid"] is True  # case does not matter


def test_list_tasks_reads_a_data_folder_without_regenerating(games, monkeypatch):
    root, files = games
    mtimes = {f: f.stat().st_mtime_ns for f in files}
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    tasks = list_alfworld_tasks("train", n=len(files))
    assert [t.config["game_file"] for t in tasks] == [str(f) for f in sorted(files)]
    assert all(t.id.startswith("alfworld/train/") and t.id.count("/") == 3 for t in tasks)
    assert {f: f.stat().st_mtime_ns for f in files} == mtimes
    with pytest.raises(ValueError, match="game_file"):
        AlfWorldEnv.reset(AlfWorldEnv.__new__(AlfWorldEnv), Task("x", "alfworld", config={}))


def test_expert_steps_per_second(games, env):
    """Report the adapter's speed along expert paths (printed; asserted only to be non-trivial)."""
    _, files = games
    n, t0 = 0, time.perf_counter()
    for f in files:
        env.reset(_task(f))
        while (a := env.expert_action()) is not None:
            env.step(a); n += 1
    rate = n / (time.perf_counter() - t0)
    print(f"ALFWorld adapter: {n} expert steps, {rate:.1f} steps/s including resets")
    assert rate > 0.5


def test_list_tasks_never_writes_into_an_official_folder(games, tmp_path):
    """A folder whose games are not the lab's (no `generated_by`) is read, never topped up."""
    import shutil
    _, files = games
    trial = tmp_path / "json_2.1.1" / "train" / files[0].parent.parent.name / files[0].parent.name
    shutil.copytree(files[0].parent, trial)
    traj = json.loads((trial / "traj_data.json").read_text())
    del traj["generated_by"]
    (trial / "traj_data.json").write_text(json.dumps(traj))
    tasks = list_alfworld_tasks("train", n=5, root=tmp_path)
    assert len(tasks) == 1 and tasks[0].metadata["task_type"] == traj["task_type"]
    assert len(list(tmp_path.rglob("game.tw-pddl"))) == 1
    assert list_alfworld_tasks("eval_out_of_distribution", root=tmp_path) == []


def test_list_tasks_generates_the_default_set_on_first_use(tmp_path, monkeypatch):
    """No official data configured: the lab's games are generated once into data_dir/alfworld, then reused."""
    monkeypatch.setenv("LABMOD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("LABMOD_ALFWORLD_DATA", "")
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    tasks = list_alfworld_tasks("eval_in_distribution")
    assert len(tasks) == 6 and {t.metadata["task_type"] for t in tasks} == set(TASK_TYPES)
    assert all(t.config["game_file"].startswith(str(tmp_path / "alfworld" / "json_2.1.1" / "valid_seen")) for t in tasks)
    mtimes = [p.stat().st_mtime_ns for p in sorted(tmp_path.rglob("game.tw-pddl"))]
    assert [t.id for t in list_alfworld_tasks("valid_seen")] == [t.id for t in tasks]
    assert [p.stat().st_mtime_ns for p in sorted(tmp_path.rglob("game.tw-pddl"))] == mtimes


def test_concurrent_envs_in_threads_do_not_corrupt_the_parser():
    "TextWorld's grammar parser is process-wide: envs driven from two threads (as rollout slots do) must not crash it."
    from concurrent.futures import ThreadPoolExecutor
    from labmod.envs.alfworld import AlfWorldEnv
    from labmod.envs.core import list_tasks
    tasks = list_tasks("alfworld", split="train")[:4]
    def play(i):
        env = AlfWorldEnv()
        try:
            out = []
            for t in tasks[i::2] * 2:
                env.reset(t)
                out.append(env.step(env.expert_action()).info["valid"])
            return out
        finally: env.close()
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(play, [0, 1]))
    assert all(all(r) for r in results)


def test_unreadable_game_file_and_closed_env_are_clear_errors(games, tmp_path):
    "A truncated game.tw-pddl is a ValueError naming the file (not a raw JSONDecodeError); a closed env says it is closed."
    import shutil
    from labmod.envs.core import EnvError
    _, files = games
    trial = tmp_path / "json_2.1.1" / "train" / "broken" / "trial_0"
    shutil.copytree(files[0].parent, trial)
    (trial / "game.tw-pddl").write_text((trial / "game.tw-pddl").read_text()[:5000])
    e = AlfWorldEnv()
    try:
        with pytest.raises(ValueError, match="broken/trial_0/game.tw-pddl is not a readable ALFWorld game"):
            e.reset(_task(trial / "game.tw-pddl"))
        assert e.reset(_task(files[0])).text and e.step(e.expert_action()).info["valid"]
    finally:
        e.close()
    with pytest.raises(EnvError, match="closed"):
        e.reset(_task(files[0]))
