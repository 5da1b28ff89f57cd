"""PolicyTrainer under DDP (accelerate, 2 CPU processes, gloo): ranks update on different samples and
end with identical weights, equal to one process updating on the union of their samples.

Run as a script under `torch.distributed.run` it is one rank of that job.
"""
import os, subprocess, sys
from pathlib import Path

import torch

UPDATES = 3


def rank_samples(rank: int):
    "Different data on each rank: sequences of different lengths, advantages of both signs."
    from labmod.rl.samples import Sample
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for i in range(4):
        p = torch.randint(2, 1000, (5,), generator=g).tolist()
        c = torch.randint(2, 1000, (2 + (i + rank) % 4,), generator=g).tolist()
        out.append(Sample(p + c, [0] * len(p) + [1] * len(c), [0.0] * (len(p) + len(c)), [1.0, -0.5, 0.8, -1.3][i] * (1 + rank)))
    return out


def make_trainer(accelerator=None):
    from labmod.rl.config import GRPOConfig
    from labmod.rl.trainer import PolicyTrainer, seed_everything
    from labmod.models import tiny_causal_lm
    seed_everything(0)
    model, tok = tiny_causal_lm(seed=0)
    return PolicyTrainer(model, tok, GRPOConfig(lr=1e-3, loss_type="dapo", micro_batch_size=2), accelerator=accelerator)


def run_rank(out_dir: str):
    from accelerate import Accelerator
    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    assert acc.num_processes == 2, acc.num_processes
    trainer = make_trainer(acc)
    samples = rank_samples(acc.process_index)
    for _ in range(UPDATES): metrics = trainer.update(samples)
    torch.save(trainer.unwrapped.state_dict(), Path(out_dir) / f"rank{acc.process_index}.pt")
    trainer.save_checkpoint(Path(out_dir) / "ckpt")   # main process writes, the other waits
    print("rank", acc.process_index, metrics)


def test_ddp_two_cpu_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29613",
                           __file__, str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    w0, w1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for k in w0: assert torch.equal(w0[k], w1[k]), f"ranks differ on {k}"
    assert (tmp_path / "ckpt" / "model.safetensors").exists()

    # one process on both ranks' samples: the "dapo" normalization counts tokens across ranks, so it is the same update
    torch.set_num_threads(1)
    single = make_trainer()
    both = rank_samples(0) + rank_samples(1)
    single.cfg.micro_batch_size = 2
    for _ in range(UPDATES): single.update(both)
    init = make_trainer().model.state_dict()
    changed = False
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(w0[k], v, atol=2e-5, rtol=1e-4, msg=lambda m: f"{k}: {m}")
        changed |= not torch.equal(v, init[k])
    assert changed


if __name__ == "__main__":
    run_rank(sys.argv[1])
