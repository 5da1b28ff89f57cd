"""A GRPO update with and without computing a micro-batch's shared prompt once (`GRPOConfig.share_prefix`).

A GRPO group's samples at one state share their prompt (State2State's one-turn targets: all of a group; task RL: its
first turn). With `share_prefix` the update runs that prompt once per micro-batch and continues every row from its
KV cache. Both sides do one full `PolicyTrainer.update` (forward, loss, backward, clipping, AdamW step) on the same
batch from the same weights: `groups` groups of `group-size` samples, each group one random prompt of `prompt-len`
tokens with answers of 4 to 4 + group-size tokens (the length of a TextWorld-Express action in the agent's format).
Runs alternate after a warm-up; the median of each and their ratio are reported, with the largest difference in the
trainer's log-probs and the relative difference of the LoRA gradients after one backward, so the speed is not bought
with a different update.

    .venv/bin/python benchmarks/shared_prefix.py [--model smollm2-135m --dtype bfloat16 --prompt-len 400 --reps 3]
"""
import argparse, statistics, time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype of the LoRA base ('none': float32)")
    ap.add_argument("--prompt-len", type=int, default=400)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from labmod.models import load_lm
    from labmod.rl.config import GRPOConfig
    from labmod.rl.losses import collate, token_logprobs
    from labmod.rl.samples import Sample
    from labmod.rl.trainer import PolicyTrainer
    from labmod.rl.run import snapshot_weights, restore_weights

    lm = load_lm(a.model, backend="hf", seed=0, lora=True, dtype=None if a.dtype == "none" else a.dtype)
    model, tok = lm.model, lm.tokenizer
    g = torch.Generator().manual_seed(0)
    for p in model.parameters():      # LoRA's B starts at 0: give the adapters weights so the gradient reaches both factors
        if p.requires_grad: torch.nn.init.normal_(p, std=0.02, generator=g)
    vocab = len(tok)
    samples = []
    for k in range(a.groups):
        prompt = torch.randint(100, vocab, (a.prompt_len,), generator=g).tolist()
        for i in range(a.group_size):
            ans = torch.randint(100, vocab, (4 + i,), generator=g).tolist()
            ids = prompt + ans
            samples.append(Sample(ids, [0] * len(prompt) + [1] * len(ans), [0.0] * len(prompt) + [-5.0] * len(ans),
                                  advantage=1.0 if (i + k) % 2 else -1.0))
    start = snapshot_weights(lm)

    # the same update? log-probs and gradient of one micro-batch (a group), both ways
    b = collate(samples[:a.group_size], tok.pad_token_id)
    grads, lps = {}, {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        lp = token_logprobs(model, b["input_ids"], b["attention_mask"], 1.0, a.prompt_len, share_prefix=share)[0] * b["loss_mask"]
        lp.sum().backward()
        lps[share] = lp.detach()
        grads[share] = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    lp_diff = float((lps[True] - lps[False]).abs().max())
    grad_rel = float((grads[True] - grads[False]).norm() / grads[False].norm())

    times = {False: [], True: []}
    for rep in range(a.reps + 1):                   # rep 0 warms up
        for share in (False, True):
            restore_weights(lm, start)
            tr = PolicyTrainer(model, tok, GRPOConfig(lr=1e-4, old_logprobs="sampler", micro_batch_size=a.micro_batch, share_prefix=share))
            t = time.perf_counter(); tr.update(samples); dt = time.perf_counter() - t
            if rep: times[share].append(dt)
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    print(f"{a.model} ({a.dtype}), {a.groups} groups x {a.group_size} samples, prompt {a.prompt_len} tokens, "
          f"micro-batch {a.micro_batch}, {a.threads} threads, {a.reps} reps")
    print(f"update, whole sequences:  {plain:.2f} s (median; {[round(x, 2) for x in times[False]]})")
    print(f"update, prompt once:      {shared:.2f} s (median; {[round(x, 2) for x in times[True]]})")
    print(f"ratio: {plain / shared:.2f}x faster; same update: max |log-prob diff| {lp_diff:.2e}, gradient relative diff {grad_rel:.2e}")


if __name__ == "__main__":
    main()
