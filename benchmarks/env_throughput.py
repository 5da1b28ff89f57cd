"""Env throughput, measured side by side in one run: raw package loop vs lab adapter vs EnvPool (1 and N workers).

Every measurement plays the same tasks along the expert/gold path (resetting to the next task when an
episode ends) for a fixed wall-clock budget and counts env steps; resets are inside the timed region, as
they are in real rollouts. The env is built and warmed up (one reset) before timing starts.

    .venv/bin/python benchmarks/env_throughput.py                       # all envs, 5 s per measurement, 2 workers
    .venv/bin/python benchmarks/env_throughput.py --env textworld_express --seconds 10 --workers 2 4

Envs whose adapter or package is not importable are skipped with a line saying why.
"""
from __future__ import annotations
import argparse, importlib, os, sys, threading, time
from pathlib import Path

from labmod.envs.core import ENV_MODULES, list_tasks, make_env
from labmod.envs.pool import EnvPool, PooledEnv

ENVS = ["textworld_express", "scienceworld", "alfworld", "miniwob"]
TASK_KWARGS = {
    "textworld_express": {"n_per_game": 3},
    "scienceworld": {"limit": 1},
    "miniwob": {"tasks": ["click-button", "click-link", "enter-text"], "seeds_per_task": 3},
}


def bench_tasks(name: str, n: int = 24):
    tasks = list_tasks(name, "train", **TASK_KWARGS.get(name, {}))
    if name == "textworld_express":
        # all eight games, in runs of 3 seeds per game: switching games costs a simulator `load` (70-280 ms,
        # far more than an episode), so a rollout engine keeps a worker on one game; this mixes both
        return tasks
    return tasks[:n]


# ---- raw package loops: what a script using the package directly would do ----

def _step_gold(env, actions, budget_end: float) -> int:
    "Step a raw package env along its gold actions until done or the time budget ends; returns steps taken."
    n = 0
    for a in actions:
        if time.perf_counter() > budget_end: break
        _, _, done, _ = env.step(a)
        n += 1
        if done: break
    return n


def raw_twx(tasks, seconds: float) -> tuple[int, float]:
    from textworld_express import TextWorldExpressEnv as RawTWX
    env = RawTWX(envStepLimit=10**9)
    try:
        loaded = [None]

        def play(task, budget_end):
            c = task.config
            if loaded[0] != (c["game"], c["params"]):  # reload only on a game change, as the adapter does
                env.load(c["game"], c["params"])
                loaded[0] = (c["game"], c["params"])
            env.reset(seed=c["seed"], gameFold=task.split, generateGoldPath=True)
            return _step_gold(env, env.getGoldActionSequence(), budget_end)
        return _timed_episodes(play, tasks, seconds)
    finally:
        env.close()


def raw_scienceworld(tasks, seconds: float) -> tuple[int, float]:
    from scienceworld import ScienceWorldEnv
    env = ScienceWorldEnv("", envStepLimit=10**6)
    try:
        def play(task, budget_end):
            c = task.config
            env.load(c["task"], c["variation"], c.get("simplifications", "easy"), generateGoldPath=True)  # the adapter's default
            return _step_gold(env, env.get_gold_action_sequence(), budget_end)
        return _timed_episodes(play, tasks, seconds)
    finally:
        env.close()


RAW_LOOPS = {"textworld_express": raw_twx, "scienceworld": raw_scienceworld}


WARMUP_S = 1.0  # every measurement first plays this long untimed: JVM JIT, first loads, browser start


def _timed_episodes(play, tasks, seconds):
    for phase in ("warmup", "timed"):
        budget = WARMUP_S if phase == "warmup" else seconds
        steps, i, t0 = 0, 0, time.perf_counter()
        end = t0 + budget
        while time.perf_counter() < end:
            steps += play(tasks[i % len(tasks)], end)
            i += 1
    return steps, time.perf_counter() - t0


# ---- lab adapter / pool loops ----

def play_expert(env, tasks, seconds: float, offset: int = 0) -> tuple[int, float]:
    "Steps along the expert path for `seconds` through any Env (adapter or PooledEnv)."
    steps, i, t0 = 0, offset, time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        env.reset(tasks[i % len(tasks)])
        i += 1
        a = env.expert_action()
        while a is not None and time.perf_counter() < end:
            s = env.step(a)
            steps += 1
            if s.done: break
            # the step info carries the next expert action where the env offers it: no extra round trip
            a = s.info["expert_action"] if "expert_action" in s.info else env.expert_action()
    return steps, time.perf_counter() - t0


def adapter_loop(name, tasks, seconds):
    env = make_env(name)
    try:
        play_expert(env, tasks, WARMUP_S)
        return play_expert(env, tasks, seconds)
    finally:
        env.close()


def pool_loop(name, tasks, seconds, n_workers):
    with EnvPool(name, n_workers) as pool:
        results = [None] * n_workers

        def run(w, budget):
            # each worker starts at its own part of the task list (in the same order as the 1-env loops)
            results[w] = play_expert(PooledEnv(pool, w), tasks, budget, offset=w * len(tasks) // n_workers)

        for budget in (WARMUP_S, seconds):  # warm-up starts and warms every worker, untimed
            threads = [threading.Thread(target=run, args=(w, budget)) for w in range(n_workers)]
            t0 = time.perf_counter()
            for t in threads: t.start()
            for t in threads: t.join()
            wall = time.perf_counter() - t0
    return sum(r[0] for r in results), wall


def importable(name: str) -> str | None:
    "None when the env's adapter module imports, else the reason."
    try:
        importlib.import_module(ENV_MODULES[name])
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def main(argv=None) -> int:
    global WARMUP_S
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", action="append", dest="envs", help=f"env (repeatable; default: {' '.join(ENVS)})")
    p.add_argument("--seconds", type=float, default=5.0, help="wall-clock budget per measurement")
    p.add_argument("--workers", type=int, nargs="+", default=[2], help="pool sizes N to compare with 1 worker")
    p.add_argument("--warmup", type=float, default=WARMUP_S, help="untimed play before every measurement (s)")
    p.add_argument("--rounds", type=int, default=2, help="measure every variant this many times, interleaved; report the best")
    a = p.parse_args(argv)
    WARMUP_S = a.warmup
    rows = []
    load = lambda: " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average at start: {load()}", flush=True)
    for name in a.envs or ENVS:
        why = importable(name)
        if why:
            print(f"SKIP {name}: adapter not importable ({why})", flush=True)
            continue
        try:
            tasks = bench_tasks(name)
        except Exception as e:
            print(f"SKIP {name}: cannot list tasks ({type(e).__name__}: {e})", flush=True)
            continue
        r = {"env": name}

        def measure(key, fn, *args):
            try:
                steps, wall = fn(*args)
                r[key] = max(r.get(key) or 0.0, steps / wall)
                print(f"  {name:18s} {key:10s} {steps:7d} steps in {wall:5.2f}s = {steps / wall:9.1f} steps/s", flush=True)
            except Exception as e:
                r.setdefault(key, None)
                print(f"  {name:18s} {key:10s} FAILED: {type(e).__name__}: {str(e)[:200]}", flush=True)

        if name not in RAW_LOOPS: print(f"  {name:18s} raw        not measured (no raw-package loop written for this env)", flush=True)
        for _ in range(a.rounds):  # interleaved, so load from other processes hits every variant alike
            if name in RAW_LOOPS: measure("raw", RAW_LOOPS[name], tasks, a.seconds)
            measure("adapter", adapter_loop, name, tasks, a.seconds)
            measure("pool1", pool_loop, name, tasks, a.seconds, 1)
            for n in a.workers: measure(f"pool{n}", pool_loop, name, tasks, a.seconds, n)
        rows.append(r)

    print(f"load average at end: {load()}")

    def ratio(r, x, y):
        return f"{r[x] / r[y]:.2f}x" if r.get(x) and r.get(y) else "-"
    print(f"\nsteps/s (expert path, resets included; best of {a.rounds} interleaved rounds of {a.seconds:g} s)")
    cols = ["raw", "adapter", "pool1"] + [f"pool{n}" for n in a.workers]
    print(f"{'env':18s} " + " ".join(f"{c:>9s}" for c in cols) + "  adapter/raw  pool1/adapter  " + "  ".join(f"pool{n}/pool1" for n in a.workers))
    for r in rows:
        vals = " ".join(f"{r[c]:9.1f}" if r.get(c) else f"{'-':>9s}" for c in cols)
        print(f"{r['env']:18s} {vals}  {ratio(r, 'adapter', 'raw'):>11s}  {ratio(r, 'pool1', 'adapter'):>13s}  "
              + "  ".join(f"{ratio(r, f'pool{n}', 'pool1'):>11s}" for n in a.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
