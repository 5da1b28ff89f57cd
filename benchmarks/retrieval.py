"""Replay-buffer retrieval and encoding speed, measured side by side in one run.

Search: a `ReplayBuffer` filled with N random unit vectors (default 100k x 384, the MiniLM size) answers
top-k queries with one float32 matmul + argpartition; measured per single query (median and p90 over Q
queries), for a batch of Q queries at once, and with an env filter. For comparison the same search in a
float16 matrix (the trap: numpy has no fast half-precision matmul on CPU) on a smaller slice.

Encoding: strings per second for `MiniLMEncoder` and `HashingEncoder` on transition keys shaped like real
ones (an abstract TextWorld-Express room state plus an action, ~300 characters).

    .venv/bin/python benchmarks/retrieval.py                      # 100k x 384, top-10, 200 queries, 512 strings
    .venv/bin/python benchmarks/retrieval.py --n 1000000 --queries 50 --encode 0
"""
from __future__ import annotations
import argparse, os, random, statistics, sys, time
from pathlib import Path
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labmod.dreamgym.replay import ReplayBuffer, Transition, get_encoder, transition_key


def random_unit(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill_buffer(n: int, dim: int, rng) -> ReplayBuffer:
    enc = get_encoder("hashing", dim=dim)       # never called: embeddings are given, only its width matters
    buf = ReplayBuffer(enc)
    chunk = 50_000
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        ts = [Transition("textworld_express" if i % 2 else "scienceworld", f"task{i % 1000}", "", f"s{i}", "a", "s'")
              for i in range(start, start + m)]
        buf.add(ts, embeddings=random_unit(m, dim, rng))
    return buf


def time_queries(fn, queries) -> tuple[list[float], list[float]]:
    "Wall and process-CPU seconds per call (CPU time is less distorted by other jobs on a shared machine)."
    wall, cpu = [], []
    for q in queries:
        t, c = time.perf_counter(), time.process_time(); fn(q)
        wall.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
    return wall, cpu


def ms(xs) -> str: return f"median {1e3 * statistics.median(xs):.2f} ms, p90 {1e3 * np.percentile(xs, 90):.2f} ms"


def fake_keys(n: int, seed: int = 0) -> list[str]:
    r = random.Random(seed)
    rooms = ["kitchen", "pantry", "living room", "bedroom", "bathroom", "backyard", "corridor"]
    objs = ["stove", "oven", "fridge (closed)", "counter: knife, cookbook", "dining chair: nothing", "coin", "box (empty)",
            "kitchen cupboard (closed)", "cutlery drawer (closed)", "trash can (closed)", "dishwasher (closed)", "shelf: apple"]
    acts = ["look around", "take coin", "open fridge", "move north", "put apple in box", "inventory", "take knife"]
    return [transition_key(f"Location: {r.choice(rooms)}\nObjects: " + "; ".join(r.sample(objs, 8)) +
                           f"\nExits: north: {r.choice(rooms)}", r.choice(acts)) for _ in range(n)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--encode", type=int, default=512, help="strings per encoder (0 skips the encoding part)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    # the lab machines are shared: the load average says how much of the CPU this run really had
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; numpy {np.__version__}")

    t = time.perf_counter()
    buf = fill_buffer(a.n, a.dim, rng)
    print(f"buffer: {len(buf)} x {a.dim} float32 ({buf.embeddings.nbytes / 2**20:.0f} MiB), filled in {time.perf_counter() - t:.1f} s")
    qs = random_unit(a.queries, a.dim, rng)

    wall, cpu = time_queries(lambda q: buf.search_vectors(q, a.k), qs)
    print(f"top-{a.k} single query ({a.queries} queries): wall {ms(wall)}; process CPU {ms(cpu)}")
    t, c = time.perf_counter(), time.process_time(); buf.search_vectors(qs, a.k)
    batch, bcpu = time.perf_counter() - t, time.process_time() - c
    print(f"top-{a.k} batch of {a.queries}: wall {1e3 * batch:.1f} ms ({1e3 * batch / a.queries:.2f} ms/query); "
          f"process CPU {1e3 * bcpu:.1f} ms")
    wall, cpu = time_queries(lambda q: buf.search_vectors(q, a.k, env="scienceworld"), qs[:50])
    print(f"top-{a.k} with env filter (50 queries): wall {ms(wall)}; process CPU {ms(cpu)}")
    # check the top-k against a full sort once (exactness, not just speed)
    s = buf.embeddings @ qs[0]
    assert [i for i, _ in buf.search_vectors(qs[0], a.k)[0]] == list(np.argsort(-s, kind="stable")[:a.k])
    m16 = min(a.n, 20_000)
    e16, q16 = buf.embeddings[:m16].astype(np.float16), qs[:5].astype(np.float16)
    t = time.perf_counter()
    for q in q16: np.argpartition(-(e16 @ q), a.k)[:a.k]
    f16 = (time.perf_counter() - t) / len(q16)
    t = time.perf_counter()
    for q in qs[:5]: np.argpartition(-(buf.embeddings[:m16] @ q), a.k)[:a.k]
    f32 = (time.perf_counter() - t) / 5
    print(f"float16 vs float32 matmul+argpartition over {m16} rows: {1e3 * f16:.2f} ms vs {1e3 * f32:.2f} ms "
          f"({f16 / max(f32, 1e-9):.0f}x slower)")

    if a.encode:
        keys = fake_keys(a.encode, a.seed)
        print(f"encoding {len(keys)} keys of ~{int(np.mean([len(k) for k in keys]))} chars:")
        for name in ("hashing", "minilm"):
            enc = get_encoder(name)
            try:
                t = time.perf_counter(); enc.encode(keys[:8]); warm = time.perf_counter() - t   # model load + first batch
            except ImportError as e:
                print(f"  {name}: skipped ({e})"); continue
            t, c = time.perf_counter(), time.process_time(); x = enc.encode(keys, batch_size=64)
            dt, dc = time.perf_counter() - t, time.process_time() - c
            print(f"  {name:8s} {len(keys) / dt:8.0f} strings/s wall, {len(keys) / dc:8.0f} strings per CPU-second "
                  f"({x.shape[1]} dims; first call incl. load {warm:.1f} s)")


if __name__ == "__main__":
    main()
