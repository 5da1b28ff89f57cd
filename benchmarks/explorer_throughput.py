"""Explorer throughput vs the env's raw step rate.

explorer   : `labmod.s2s.explore.explore` with `RandomExplorer` in a warm `EnvPool` of n workers (JVM start not
             counted): env steps per second of wall time.
raw        : the same episodes (same tasks, same actions) driven by a bare loop in one process, one env:
             reset, then `valid_actions()` + `step(action)` per step -- the least any valid-action explorer must
             do. Replaying the explorer's own episodes makes the work identical (episode lengths and resets
             matter: a TWX reset costs as much as ~20 steps).
efficiency : explorer / (raw x workers); the goal is >= 0.8.
in-worker  : share of the workers' episode time spent inside env calls (the explorer's own overhead is the
             rest); pool use: summed episode time / (wall x workers) (IPC, scheduling, and -- when the machine
             has fewer free cores than workers -- CPU contention).
Raw and explorer runs alternate `--repeats` times; the best of each is reported, so a noisy neighbour on a
shared machine hurts both sides alike. The load average is printed: read 2-worker numbers with it.

Usage: .venv/bin/python benchmarks/explorer_throughput.py [--envs textworld_express scienceworld] [--workers 1 2]
"""
from __future__ import annotations
import argparse, os, time
from labmod.envs.core import list_tasks, make_env
from labmod.s2s.explore import RandomExplorer, exploration_env_kwargs, explore, open_exploration_pool

SETUPS = {  # tasks, steps per episode
    "textworld_express": (lambda: list_tasks("textworld_express", games=["cookingworld", "twc", "coin"], n_per_game=4), 150),
    "scienceworld": (lambda: list_tasks("scienceworld", tasks=["boil", "find-living-thing"], limit=1), 25),
}


def raw_seconds(env, trajs) -> float:
    "Wall time of a bare loop over the same episodes: reset, then valid_actions + step per recorded action."
    t0 = time.perf_counter()
    for t in trajs:
        env.reset(t.task())
        for a in t.actions:
            env.valid_actions()
            env.step(a)
    return time.perf_counter() - t0


def measure(env_name: str, workers: int, repeats: int) -> dict:
    make_tasks, steps = SETUPS[env_name]
    tasks = make_tasks()
    kw = exploration_env_kwargs(env_name, steps)
    env = make_env(env_name, **kw)
    best_raw = best_exp = 0.0
    try:
        with open_exploration_pool(env_name, workers, kw) as pool:
            warm = explore(env_name, tasks[:workers], RandomExplorer(), steps_per_episode=steps, pool=pool, progress=False)
            raw_seconds(env, warm)  # JIT warm-up of the local env too
            for r in range(repeats):
                t0 = time.perf_counter()
                trajs = explore(env_name, tasks, RandomExplorer(), steps_per_episode=steps, pool=pool, seed=r, progress=False)
                wall = time.perf_counter() - t0
                n = sum(len(t.steps) for t in trajs)
                best_exp = max(best_exp, n / wall)
                best_raw = max(best_raw, n / raw_seconds(env, trajs))
                ep_s = sum(t.metadata["seconds"] for t in trajs)
                in_worker = sum(t.metadata["env_seconds"] for t in trajs) / ep_s
                pool_use = ep_s / (wall * workers)
    finally:
        env.close()
    return dict(steps=n, raw=best_raw, explorer=best_exp, efficiency=best_exp / (best_raw * workers),
                in_worker=in_worker, pool_use=pool_use)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", nargs="+", default=list(SETUPS))
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print(f"cpus={os.cpu_count()} load_avg_1m={os.getloadavg()[0]:.1f}")
    print(f"{'env':18s} {'workers':>7s} {'steps':>6s} {'raw/s':>8s} {'explorer/s':>10s} {'efficiency':>10s} "
          f"{'in-worker':>9s} {'pool use':>8s}")
    for env_name in args.envs:
        for w in args.workers:
            m = measure(env_name, w, args.repeats)
            print(f"{env_name:18s} {w:7d} {m['steps']:6d} {m['raw']:8.1f} {m['explorer']:10.1f} {m['efficiency']:10.2f} "
                  f"{m['in_worker']:9.2f} {m['pool_use']:8.2f}", flush=True)
    print(f"load_avg_1m_after={os.getloadavg()[0]:.1f}")
