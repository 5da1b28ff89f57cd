"""Update throughput: labmod's GRPO update vs TRL GRPOTrainer's training step, same model, same batch.

Both sides do one full optimizer step on the same batch (forward, loss, backward, grad clipping, AdamW
step): labmod through `PolicyTrainer.update`, TRL through `GRPOTrainer.compute_loss` + its accelerator's
backward + its optimizer (what `Trainer.training_step` runs after TRL's generation step, which is left
out since it is not part of the update). Runs alternate, after a warm-up, and the median is reported.

    .venv/bin/python benchmarks/grpo_vs_trl.py [--batch 16 --prompt-len 32 --completion-len 96 --reps 7]
"""
import argparse, copy, statistics, tempfile, time
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=96)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)

    import trl
    from datasets import Dataset
    from labmod.rl.config import GRPOConfig
    from labmod.rl.trainer import PolicyTrainer
    from labmod.rl.samples import Sample
    from labmod.models import tiny_causal_lm

    model, tok = tiny_causal_lm(seed=0, hidden=a.hidden, layers=a.layers)
    tmp = Path(tempfile.mkdtemp())
    model.save_pretrained(tmp / "m"); tok.save_pretrained(tmp / "m")
    g = torch.Generator().manual_seed(0)
    B, P, C = a.batch, a.prompt_len, a.completion_len
    prompts = torch.randint(2, 1000, (B, P), generator=g)
    lens = torch.randint(C // 2, C + 1, (B,), generator=g)
    comp = torch.randint(2, 1000, (B, C), generator=g)
    cmask = (torch.arange(C)[None] < lens[:, None]).long()
    comp = comp * cmask + tok.pad_token_id * (1 - cmask)
    adv = torch.randn(B, generator=g)
    old = -7.0 + 0.1 * torch.randn(B, C, generator=g)
    ref = -7.0 + 0.1 * torch.randn(B, C, generator=g)
    tokens = int(B * P + cmask.sum())

    samples = []
    for i in range(B):
        n = int(lens[i])
        samples.append(Sample(prompts[i].tolist() + comp[i, :n].tolist(), [0] * P + [1] * n,
                              [0.0] * P + old[i, :n].tolist(), float(adv[i]),
                              ref_logprobs=[0.0] * P + ref[i, :n].tolist() if a.beta else None))
    cfg = GRPOConfig(lr=1e-6, loss_type=a.loss_type, beta=a.beta, micro_batch_size=B, old_logprobs="sampler")
    ours = PolicyTrainer(copy.deepcopy(model), tok, cfg)

    args = trl.GRPOConfig(output_dir=str(tmp / "trl"), use_cpu=True, bf16=False, per_device_train_batch_size=B,
                          num_generations=B if B <= 8 else 8, loss_type=a.loss_type, beta=a.beta, learning_rate=1e-6,
                          max_completion_length=C, report_to="none", save_strategy="no", max_grad_norm=1.0)
    trainer = trl.GRPOTrainer(model=str(tmp / "m"), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=args, train_dataset=Dataset.from_dict({"prompt": ["x"] * B}), processing_class=tok)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    inputs = dict(prompt_ids=prompts, prompt_mask=torch.ones_like(prompts), completion_ids=comp, completion_mask=cmask,
                  advantages=adv, old_per_token_logps=old * cmask, num_items_in_batch=cmask.sum())
    if a.beta: inputs["ref_per_token_logps"] = ref * cmask

    def trl_step():
        m = trainer.model; m.train()
        loss = trainer.compute_loss(m, inputs)
        trainer.accelerator.backward(loss)
        trainer.accelerator.clip_grad_norm_(m.parameters(), args.max_grad_norm)
        trainer.optimizer.step(); trainer.optimizer.zero_grad(set_to_none=True)

    def timed(fn):
        t0 = time.perf_counter(); fn(); return time.perf_counter() - t0

    for _ in range(2): timed(lambda: ours.update(samples)); timed(trl_step)   # warm-up
    t_ours, t_trl = [], []
    for _ in range(a.reps):
        t_ours.append(timed(lambda: ours.update(samples)))
        t_trl.append(timed(trl_step))
    mo, mt = statistics.median(t_ours), statistics.median(t_trl)
    print(f"model hidden={a.hidden} layers={a.layers} params={sum(p.numel() for p in model.parameters())/1e6:.1f}M "
          f"batch={B}x({P}+<={C}) tokens={tokens} loss_type={a.loss_type} beta={a.beta} threads={torch.get_num_threads()}")
    print(f"labmod GRPO update : {mo*1000:8.1f} ms/step  {tokens/mo:9.0f} tokens/s  (runs: {', '.join(f'{x*1000:.0f}' for x in t_ours)})")
    print(f"TRL GRPOTrainer    : {mt*1000:8.1f} ms/step  {tokens/mt:9.0f} tokens/s  (runs: {', '.join(f'{x*1000:.0f}' for x in t_trl)})")
    print(f"ratio labmod/TRL tokens/s: {mt/mo:.2f}x")


if __name__ == "__main__":
    main()
