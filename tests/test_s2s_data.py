"State2State data side on real envs: exploration through the rollout engine, dataset building, independent replay checks, the verifier."
import json
import shutil
import pytest
from labmod.core import Observation, Trajectory, Turn
from labmod.envs.core import SharedEnvs, list_tasks, make_env
from labmod.s2s.explore import ExploreConfig, RandomExplorer, exploration_envs, explore, trajectory_prefix
from labmod.s2s.tasks import (ENV_BLACKLISTS, Candidate, S2SBuildConfig, build_s2s_dataset, collect_candidates,
                              dedupe_candidates, reject_reason, source_task, tasks_from_hf)
from labmod.s2s.verify import FuzzyStateMatcher, StateReachingEnv

STEPS = 60


@pytest.fixture(scope="module")
def twx_run(tmp_path_factory):
    tasks = list_tasks("textworld_express", games=["cookingworld", "twc", "coin"], n_per_game=2)
    out = tmp_path_factory.mktemp("s2s")
    with SharedEnvs() as shared:
        make = exploration_envs("textworld_express", STEPS, shared=shared)
        cfg = ExploreConfig(steps_per_episode=STEPS, episodes_per_task=2, seed=7, progress=False)
        trajs = explore("textworld_express", tasks, RandomExplorer(), cfg, envs=make)
        again = explore("textworld_express", tasks[:3], RandomExplorer(), cfg, envs=make)
        ds = build_s2s_dataset("textworld_express", trajs, S2SBuildConfig(n_targets=30, val_size=0.1, seed=7, out_dir=str(out)),
                               envs=make, progress=False)
    return tasks, trajs, again, ds, out


def actions(t): return [u.action for u in t.turns]


def content(t):
    "What an episode did, without its timings."
    return {k: v for k, v in t.metadata.items() if k != "seconds"}, [(u.action, u.obs.text, u.reward, u.done) for u in t.turns]


def test_exploration_is_deterministic_and_has_provenance(twx_run):
    tasks, trajs, again, _, _ = twx_run
    assert len(trajs) == 2 * len(tasks)
    # same seed, same episodes (also when fewer tasks run: an episode's choices do not depend on the others)
    assert [content(t) for t in again] == [content(t) for t in trajs[:6]]
    t = trajs[0]
    assert t.task == tasks[0] and t.metadata["id"] == f"{tasks[0].id}#ep0" and trajs[1].metadata["id"] == f"{tasks[0].id}#ep1"
    assert t.metadata["strategy"] == "random" and t.metadata["seed"] == 7 and t.metadata["episode"] == 0 and trajs[1].metadata["episode"] == 1
    assert t.metadata["stopped"] in ("done", "steps", "no valid actions") and t.metadata["fallbacks"] == 0
    assert actions(trajs[0]) != actions(trajs[1])  # two episodes of one task differ
    assert all(u.action and isinstance(u.obs.text, str) for u in t.turns)
    assert sum(len(t.turns) for t in trajs) > 100
    # another seed explores differently
    other = explore("textworld_express", tasks[:1], RandomExplorer(), ExploreConfig(steps_per_episode=STEPS, seed=8, progress=False))
    assert actions(other[0]) != actions(trajs[0])


def test_every_kept_target_is_reproduced_by_an_independent_replay(twx_run):
    _, _, _, ds, _ = twx_run
    assert len(ds.tasks) >= 20 and len(ds.tasks_val) >= 1
    env = make_env("textworld_express", step_limit=10 * STEPS)
    try:
        for task in ds.tasks:
            env.reset(source_task(task))
            for a in task.metadata["prefix_actions"]: obs = env.step(a).obs.text
            assert env.normalize(obs) == env.normalize(task.target), task.id
            assert task.metadata["source_step"] == len(task.metadata["prefix_actions"]) >= 10
    finally:
        env.close()


def test_filters_drop_error_texts(twx_run):
    _, trajs, _, ds, _ = twx_run
    bl = ENV_BLACKLISTS["textworld_express"]
    assert reject_reason("Unknown action: I'm not sure what you mean.", bl)  # TWX's answer to an invalid command
    assert reject_reason("No known action matches that input.", ENV_BLACKLISTS["scienceworld"])
    assert reject_reason("Nothing happens.", ENV_BLACKLISTS["alfworld"])
    assert reject_reason("-= Welcome to TextWorld, ALFRED! =-", ENV_BLACKLISTS["alfworld"])
    assert all(reject_reason(t.target, bl) is None for t in ds.tasks)
    # an error text in a real trajectory is rejected: splice TWX's real invalid-action feedback into one
    src = next(t for t in trajs if len(t.turns) >= 12)
    env = make_env("textworld_express")
    try:
        env.reset(src.task); bad = env.step("fly to the moon").obs.text
    finally:
        env.close()
    t = Trajectory.from_dict(src.to_dict())
    t.turns[11] = Turn(None, "fly to the moon", "fly to the moon", obs=Observation(bad))
    cands, rejected = collect_candidates([t], lambda xs: [x.lower() for x in xs], S2SBuildConfig(), "textworld_express")
    assert rejected["blacklist"] >= 1 and all(c.step != 12 for c in cands)


def test_dedupe_scopes():
    heat = Candidate(0, 10, "You heat the egg 1.", "you heat the egg 1", "heat", True)
    look = Candidate(0, 11, "You see a fridge.", "you see a fridge", "see", False)
    cands = [heat, look, Candidate(1, 12, heat.text, heat.norm, "heat", True), Candidate(1, 13, look.text, look.norm, "see", False),
             Candidate(1, 14, heat.text, heat.norm, "heat", True)]
    kept = dedupe_candidates(cands)
    assert [(c.traj, c.verb) for c in kept] == [(0, "heat"), (0, "see"), (1, "heat")]


def test_dataset_export_and_stats(twx_run):
    _, trajs, _, ds, out = twx_run
    import datasets
    hf = datasets.load_from_disk(str(out / "dataset"))
    assert {"id", "env", "initial_config", "task_target_state", "provenance"} <= set(hf.column_names)
    assert [t.to_dict() for t in tasks_from_hf(hf)] == [t.to_dict() for t in ds.tasks]
    prov = json.loads(hf[0]["provenance"])
    assert {"source_task_id", "source_step", "prefix_actions", "verb", "seed", "strategy"} <= set(prov)
    src = next(t for t in trajs if t.metadata["id"] == prov["source_trajectory"])
    assert prov["prefix_actions"] == trajectory_prefix(src, prov["source_step"]) and prov["source_task_id"] == src.task.id
    st = ds.stats
    assert st["n_tasks"] == len(ds.tasks) and sum(st["by_verb"].values()) == st["n_tasks"]
    assert set(st["by_family"]) <= {"cookingworld", "twc", "coin"} and 0 < st["unique_ratio"] <= 1
    assert st["source_step"]["median"] >= 10 and st["target_chars"]["max"] >= st["target_chars"]["median"]
    assert st["funnel"]["kept"] == st["n_tasks"] and json.loads((out / "stats.json").read_text())["n_tasks"] == st["n_tasks"]
    assert len(ds.table()) > 10


def test_state_reaching_env_pays_only_when_the_target_is_reached(twx_run):
    _, _, _, ds, _ = twx_run
    env = StateReachingEnv(make_env("textworld_express", step_limit=10 * STEPS), max_steps=10 * STEPS)
    try:
        for task in ds.tasks[:8]:
            env.reset(task)
            assert not env.initial_match
            prefix = task.metadata["prefix_actions"]
            steps = [env.step(a) for a in prefix]
            assert [s.reward for s in steps] == [0.0] * (len(prefix) - 1) + [1.0], task.id
            assert steps[-1].done and steps[-1].info["success"] and steps[-1].info["target_reached"]
            assert not any(s.done for s in steps[:-1])
    finally:
        env.close()


def test_fuzzy_matcher_scores_structure():
    tree = [{"id": i, "role": r, "name": n, "depth": 1} for i, (r, n) in
            enumerate([("heading", "Form"), ("textbox", ""), ("checkbox", "a"), ("button", "Submit")])]
    m = FuzzyStateMatcher(threshold=0.9)
    assert m.score(tree, [dict(n, id=n["id"] + 7) for n in tree]) == 1.0
    changed = [dict(n, name="Cancel") if n["role"] == "button" else n for n in tree]
    assert m.score(tree, changed) < 0.9 and not m.match(tree, changed)


@pytest.mark.skipif(shutil.which("java") is None, reason="ScienceWorld needs Java")
def test_scienceworld_exploration_builds_replayable_targets():
    # ScienceWorld's valid-action list costs ~0.1-0.3 s a step: keep the episodes short
    tasks = list_tasks("scienceworld", tasks=["find-living-thing", "test-conductivity"], limit=1)
    with SharedEnvs() as shared:
        make = exploration_envs("scienceworld", 12, shared=shared)
        trajs = explore("scienceworld", tasks, RandomExplorer(two_phase=True), ExploreConfig(steps_per_episode=12, seed=3, progress=False),
                        envs=make)
        ds = build_s2s_dataset("scienceworld", trajs, S2SBuildConfig(n_targets=5, min_step=4, val_size=0, seed=3), envs=make,
                               progress=False)
    assert all("focus on" not in a for t in trajs for a in actions(t))   # a wrong focus would end the episode
    assert all(t.metadata["strategy"] == "random-two-phase" for t in trajs)
    assert len(ds.tasks) >= 3 and ds.stats["funnel"]["replay_checked"] >= len(ds.tasks)
    env = make_env("scienceworld", step_limit=1000)
    try:
        for task in ds.tasks:
            env.reset(source_task(task))
            for a in task.metadata["prefix_actions"]: obs = env.step(a).obs.text
            assert env.normalize(obs) == env.normalize(task.target), task.id
    finally:
        env.close()
