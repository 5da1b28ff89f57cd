"""Explorer throughput: exploration through the rollout engine with envs in threads vs in `EnvPool` worker
processes, against the env's raw step rate, measured side by side in one run.

raw      : the same episodes (same tasks, same actions) driven by a bare loop in one process, one env: reset,
           then `valid_actions()` + `step(action)` per step -- the least any valid-action explorer must do.
           Replaying the explorer's own episodes makes the work identical (episode lengths and resets matter:
           a TWX reset costs as much as ~20 steps).
thread   : `labmod.s2s.explore.explore` with `RandomExplorer`, n engine slots holding in-thread envs (each
           TextWorld-Express / ScienceWorld env runs its own JVM; calls release the GIL), lent by a warm
           `SharedEnvs` (JVM start not counted).
process  : the same, each slot holding a worker of a warm n-worker `EnvPool` (`pool.env(i)`): process isolation,
           one pipe round trip per env call.
Ratios: thread / (raw x n) and process / (raw x n) are the parallel efficiencies (1.0 = n times one bare env);
process / thread says which slot kind is faster here. env use: summed env-call time / (wall x n) (the rest is the
engine, the explorer and, when the machine has fewer free cores than envs, CPU contention).
Runs alternate `--repeats` times; the best of each is reported, so a noisy neighbour on a shared machine hurts all
sides alike. The load average is printed: read 2-env numbers with it.

Usage: .venv/bin/python benchmarks/explorer_throughput.py [--envs textworld_express scienceworld] [--workers 1 2]
"""
from __future__ import annotations
import argparse, os, threading, time
from labmod.envs.core import EnvWrapper, SharedEnvs, list_tasks, make_env
from labmod.envs.pool import EnvPool
from labmod.s2s.explore import ExploreConfig, RandomExplorer, exploration_env_kwargs, exploration_envs, explore

SETUPS = {  # tasks, steps per episode
    "textworld_express": (lambda: list_tasks("textworld_express", games=["cookingworld", "twc", "coin"], n_per_game=4), 150),
    "scienceworld": (lambda: list_tasks("scienceworld", tasks=["boil", "find-living-thing"], limit=2), 25),
}


class _Lent(EnvWrapper):
    "A pool worker lent to one engine slot; closing it hands the worker back (the pool owns the process)."
    def __init__(self, inner, give_back):
        super().__init__(inner); self._give_back = give_back
    def close(self):
        if self._give_back is not None: self._give_back(); self._give_back = None


def pool_envs(pool: EnvPool):
    "A zero-argument env factory handing each engine slot its own worker of `pool`."
    free, lock = list(range(pool.n_workers))[::-1], threading.Lock()
    def lend():
        with lock: i = free.pop()
        def give_back():
            with lock: free.append(i)
        return _Lent(pool.env(i), give_back)
    return lend


def raw_seconds(env, trajs) -> float:
    "Wall time of a bare loop over the same episodes: reset, then valid_actions + step per recorded action."
    t0 = time.perf_counter()
    for t in trajs:
        env.reset(t.task)
        for u in t.turns:
            env.valid_actions()
            env.step(u.action)
    return time.perf_counter() - t0


def timed(env_name, tasks, cfg, envs) -> tuple:
    "(steps per second, steps, env use, trajectories) of one exploration run."
    t0 = time.perf_counter()
    trajs = explore(env_name, tasks, RandomExplorer(), cfg, envs=envs)
    wall = time.perf_counter() - t0
    n = sum(len(t.turns) for t in trajs)
    env_s = sum(u.timings.get("env_s", 0.0) for t in trajs for u in t.turns)
    return n / wall, n, env_s / (wall * cfg.n_envs), trajs


def measure(env_name: str, n: int, repeats: int) -> dict:
    make_tasks, steps = SETUPS[env_name]
    tasks = make_tasks()
    kw = exploration_env_kwargs(env_name, steps)
    best = {"raw": 0.0, "thread": 0.0, "process": 0.0}
    use = {}
    with SharedEnvs() as shared, EnvPool(env_name, n, kw) as pool:
        modes = {"thread": exploration_envs(env_name, steps, shared=shared), "process": pool_envs(pool)}
        warm = ExploreConfig(steps_per_episode=steps, n_envs=n, progress=False)
        for envs in modes.values(): explore(env_name, tasks[:n], RandomExplorer(), warm, envs=envs)   # start every JVM
        env = make_env(env_name, **kw)
        try:
            raw_seconds(env, explore(env_name, tasks[:1], RandomExplorer(), warm, envs=modes["thread"]))  # warm the bare env too
            for r in range(repeats):
                cfg = ExploreConfig(steps_per_episode=steps, n_envs=n, seed=r, progress=False)
                for mode, envs in modes.items():
                    rate, n_steps, u, trajs = timed(env_name, tasks, cfg, envs)
                    if rate > best[mode]: best[mode], use[mode] = rate, u
                best["raw"] = max(best["raw"], n_steps / raw_seconds(env, trajs))
        finally:
            env.close()
    return dict(steps=n_steps, **best, thread_eff=best["thread"] / (best["raw"] * n),
                process_eff=best["process"] / (best["raw"] * n), process_vs_thread=best["process"] / best["thread"],
                thread_use=use["thread"], process_use=use["process"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", nargs="+", default=list(SETUPS))
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"cpus={os.cpu_count()} load_avg_1m={os.getloadavg()[0]:.1f}")
    head = ("env", "n", "steps", "raw/s", "thread/s", "process/s", "thread eff", "process eff", "proc/thread", "thread use", "proc use")
    print(f"{head[0]:18s} " + " ".join(f"{h:>11s}" for h in head[1:]))
    for env_name in args.envs:
        for n in args.workers:
            m = measure(env_name, n, args.repeats)
            vals = [n, m["steps"], m["raw"], m["thread"], m["process"], m["thread_eff"], m["process_eff"], m["process_vs_thread"],
                    m["thread_use"], m["process_use"]]
            print(f"{env_name:18s} " + " ".join(f"{v:11d}" if isinstance(v, int) else f"{v:11.2f}" for v in vals), flush=True)
    print(f"load_avg_1m_after={os.getloadavg()[0]:.1f}")
