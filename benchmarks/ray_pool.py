"""Env workers on Ray vs in this machine's process pool, and throughput vs the number of env actors; ratios side by side in one run.

1. Same envs, same episodes: a seeded random player (RandomPolicy: no LM, so the envs and their transport are what is
   measured) plays the same TextWorld-Express tasks through one `RolloutEngine` whose slots hold (a) `EnvPool` workers
   (processes) and (b) `RayEnvPool` actors on a local Ray cluster, N of each; rounds are interleaved (process, ray,
   process, ray, ...) and the medians compared. Want: ray / process >= 0.9.
2. Scaling: a bounded local cluster (`--cluster-cpus`, 2 by default), 1..K actors of `1/K` CPU each would all fit;
   each actor count runs the same episodes. The bottleneck-bound ideal for n actors is
   `min(n, cluster CPUs, machine cores) x` the one-actor throughput: actors scale until the CPUs (or the cores)
   run out. Printed: measured turns/s, ideal turns/s, measured / ideal.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ray_pool.py                      # 2 workers, actors 1 2 4, 3 rounds
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ray_pool.py --workers 2 --actors 1 2 4 8 --rounds 5
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ray_pool.py --env scienceworld --actors     # heavier steps, no sweep

A timed run is one `engine.run(tasks, group_size)`: resets, steps and the engine's own bookkeeping, nothing else;
envs are built and warmed (one untimed run) before timing starts.
"""
from __future__ import annotations
import argparse, os, statistics, time

from labmod.agent import RandomPolicy
from labmod.envs.core import list_tasks
from labmod.envs.pool import EnvPool
from labmod.envs.ray_pool import RayEnvPool, RayPoolConfig, pool_factory, ray_init
from labmod.rollout import RolloutConfig, RolloutEngine


TASKS = {   # light steps (TextWorld-Express: well under 1 ms) show the transport's cost; ScienceWorld's are heavier
    "textworld_express": lambda: list_tasks("textworld_express", "train", games=["coin"], n_per_game=16),
    "scienceworld": lambda: list_tasks("scienceworld", "train", tasks=["boil", "melt", "find-living-thing", "power-component"], limit=2),
}


def latency(pool, n: int = 200) -> float:
    "Median seconds of one call round trip to worker 0 (`normalize`: the env does next to nothing)."
    out = []
    for _ in range(n):
        t0 = time.perf_counter(); pool.call(0, "normalize", "x"); out.append(time.perf_counter() - t0)
    return statistics.median(out)


def timed(engine: RolloutEngine, tasks, group_size: int) -> tuple[float, int]:
    "(turns per second, turns) of one run."
    t0 = time.perf_counter()
    groups = engine.run(tasks, group_size)
    dt = time.perf_counter() - t0
    turns = sum(len(t.turns) for g in groups for t in g)
    return turns / dt, turns


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="env workers for the process-vs-Ray comparison")
    ap.add_argument("--env", default="textworld_express", choices=sorted(TASKS), help="the env both pools run")
    ap.add_argument("--actors", type=int, nargs="*", default=[1, 2, 4], help="actor counts for the scaling sweep (none: skip it)")
    ap.add_argument("--cluster-cpus", type=int, default=2, help="CPUs of the bounded local Ray cluster")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds per setting (medians reported)")
    ap.add_argument("--max-turns", type=int, default=10)
    args = ap.parse_args()
    tasks, group = TASKS[args.env](), 2
    t0 = time.perf_counter()
    res = ray_init(num_cpus=args.cluster_cpus)
    print(f"local Ray cluster: {res['CPU']:g} CPUs (started in {time.perf_counter() - t0:.1f} s); machine cores: {os.cpu_count()}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{len(tasks)} {args.env} tasks x {group} episodes, random player, max_turns={args.max_turns}\n")

    # 1. process pool vs Ray pool, N workers each, interleaved
    n = args.workers
    cfg = RolloutConfig(max_turns=args.max_turns, n_envs=n, seed=0)
    with EnvPool(args.env, n) as procs, RayEnvPool(args.env, n, cfg=RayPoolConfig(num_cpus=args.cluster_cpus / n)) as actors:
        engines = {"process": RolloutEngine(RandomPolicy(), pool_factory(procs), cfg),
                   "ray": RolloutEngine(RandomPolicy(), actors.factory(), cfg)}
        for e in engines.values(): e.run(tasks[:n], 1)   # build and warm every env
        rates = {k: [] for k in engines}
        for _ in range(args.rounds):
            for k, e in engines.items(): rates[k].append(timed(e, tasks, group)[0])
        for e in engines.values(): e.close()
        lat = {"process": latency(procs), "ray": latency(actors)}
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"## {n} env workers: process pool vs Ray actors (median of {args.rounds} interleaved rounds)")
    for k, v in rates.items(): print(f"  {k:8s} {med[k]:7.1f} turns/s   rounds: {', '.join(f'{x:.1f}' for x in v)}")
    print(f"  ratio ray / process = {med['ray'] / med['process']:.2f}  (want >= 0.9)")
    print(f"  one call's round trip (median of 200 `normalize`): process {lat['process'] * 1e3:.2f} ms, ray {lat['ray'] * 1e3:.2f} ms\n")
    if not args.actors: return

    # 2. throughput vs number of actors on the bounded cluster
    print(f"## throughput vs env actors, local cluster of {args.cluster_cpus} CPUs")
    kmax = max(args.actors)
    sweep = {}
    with RayEnvPool(args.env, kmax, cfg=RayPoolConfig(num_cpus=args.cluster_cpus / kmax)) as pool:
        lend = pool_factory(pool)            # one lender for the sweep: each engine hands its actors back on close
        with RolloutEngine(RandomPolicy(), lend, RolloutConfig(max_turns=args.max_turns, n_envs=kmax)) as e:
            e.run(tasks[:kmax], 1)           # builds and warms every actor's env once
        for r in range(args.rounds):
            for k in args.actors:
                with RolloutEngine(RandomPolicy(), lend, RolloutConfig(max_turns=args.max_turns, n_envs=k, seed=0)) as e:
                    e.run(tasks[:k], 1)      # slots build (borrow) their envs outside the timed run
                    sweep.setdefault(k, []).append(timed(e, tasks, group)[0])
    one = statistics.median(sweep[min(args.actors)]) / min(args.actors)
    print(f"  {'actors':>6} {'turns/s':>9} {'ideal':>9} {'measured/ideal':>15}")
    for k in args.actors:
        m, ideal = statistics.median(sweep[k]), one * min(k, args.cluster_cpus, os.cpu_count())
        print(f"  {k:6d} {m:9.1f} {ideal:9.1f} {m / ideal:15.2f}")
    print("  ideal = min(actors, cluster CPUs, cores) x the 1-actor rate (the slowest of actors, CPUs, cores bounds the rate)")


if __name__ == "__main__":
    main()
