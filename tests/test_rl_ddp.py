"""DDP on 2 CPU processes (accelerate, gloo). The trainer: ranks update on different samples and end with identical
weights, equal to one process updating on the union of their samples. The training run: `rl.train` on
TextWorld-Express with one rank left without any informative group, which must neither deadlock nor diverge.
The same run started from a notebook with `accelerate.notebook_launcher`.

Run as a script under `torch.distributed.run` it is one rank of those jobs.
"""
import json, os, subprocess, sys
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
    torch.manual_seed(100 + acc.process_index)           # each rank's own RNG stream goes into the checkpoint
    want = torch.rand(3)
    torch.manual_seed(100 + acc.process_index)
    trainer.save_checkpoint(Path(out_dir) / "ckpt")   # main process writes, the other waits
    torch.manual_seed(12345); trainer.load_checkpoint(Path(out_dir) / "ckpt")
    assert torch.equal(torch.rand(3), want), f"rank {acc.process_index} did not get its own RNG back"
    print("rank", acc.process_index, metrics)


def test_ddp_two_cpu_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29613",
                           __file__, str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    w0, w1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for k in w0: assert torch.equal(w0[k], w1[k]), f"ranks differ on {k}"
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    ranks = torch.load(tmp_path / "ckpt" / "state.pt", weights_only=True)["rng_ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["torch"], ranks[1]["torch"])

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


def run_training(out_dir: str):
    """One rank of `rl.train` on TWX coin. Which rank has a learning signal is forced (the test is of the DDP mechanics):
    rank 1's groups all get reward 0, so dynamic sampling leaves it nothing to train on; on rank 0 the first episode of
    every group is credited 1 on top of the env's reward, so every group there is informative."""
    from accelerate import Accelerator
    from labmod.agent import Agent
    from labmod.envs.core import list_tasks, make_env
    from labmod.models import load_lm
    from labmod.rl import GRPOConfig, RunConfig, RunHooks, RunTasks, WarmStart, train
    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)

    class NothingToLearnOnRank1(RunHooks):
        def groups(self, tasks, groups):
            for g in groups:
                if acc.process_index == 1:
                    for turn in (turn for t in g for turn in t.turns): turn.reward, turn.info["success"] = 0.0, False
                elif g and g[0].turns: g[0].turns[-1].reward += 1.0
            return groups

    lm = load_lm("tiny", seed=0)
    sums, sync = [], lm.sync_weights
    def checksum_then_sync():   # the run syncs the generation engine after every update: record the weights there
        sums.append(float(sum(p.detach().double().sum() for p in lm.model.parameters()))); sync()
    lm.sync_weights = checksum_then_sync
    agent = Agent(lm, max_new_tokens=16, history_k=0)
    pool = list_tasks("textworld_express", "train", games=["coin"], n_per_game=48)
    dev = list_tasks("textworld_express", "dev", games=["coin"], n_per_game=4)
    cfg = RunConfig(steps=3, groups_per_step=3, group_size=4, max_turns=4, n_envs=1, eval_every=0, eval_temperature=1.0,
                    max_gen_batches=1, seed=0, progress=False, warm=WarmStart(source="random", epochs=2),
                    algo=GRPOConfig(lr=5e-4, old_logprobs="sampler", micro_batch_size=4))
    res = train(agent, lambda: make_env("textworld_express"), RunTasks(pool[8:], dev, warm=pool[:8]), cfg,
                hooks=NothingToLearnOnRank1(), accelerator=acc)
    hist = [{k: v for k, v in h.items() if isinstance(v, (int, float, bool))} for h in res["history"]]
    (Path(out_dir) / f"run{acc.process_index}.json").write_text(json.dumps({"sums": sums, "history": hist, "after": res["after"]}))


def test_ddp_run_with_a_rank_without_informative_groups(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29614",
                           __file__, "run", str(tmp_path)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"run{i}.json").read_text()) for i in (0, 1))
    assert r0["sums"] == r1["sums"], "the ranks' weights differ after an update"
    assert len(set(r0["sums"])) > 1, "no update changed the weights"
    empty = [i for i, (a, b) in enumerate(zip(r0["history"], r1["history"])) if b.get("samples") == 0 and a.get("samples", 0) > 0]
    assert empty, f"rank 1 never updated on nothing while rank 0 trained: {r0['history']} {r1['history']}"
    assert r0["after"] == r1["after"], "the ranks read different held-out results"
    print(f"weights identical after {len(r0['sums'])} syncs; rank 1 trained on nothing in updates {empty}; held-out {r0['after']['success']:.3f}")


def test_ddp_from_a_notebook(tmp_path, monkeypatch):
    """The same two-rank run started the way a notebook user starts it: a Jupyter kernel runs a cell that defines the
    training function and calls `accelerate.notebook_launcher(main, num_processes=2)` (forked processes, gloo on CPU)."""
    import nbformat
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook
    here, out = str(Path(__file__).parent), str(tmp_path / "out")
    nb = new_notebook(cells=[
        new_code_cell(f"import sys; sys.path.insert(0, {here!r})\nfrom accelerate import notebook_launcher\nfrom test_rl_ddp import run_training"),
        new_code_cell(f"def main():\n    import torch; torch.set_num_threads(1)\n    run_training({out!r})\n\n"
                      "notebook_launcher(main, num_processes=2, use_port='29615')")])
    Path(out).mkdir()
    monkeypatch.setenv("OMP_NUM_THREADS", "1"); monkeypatch.setenv("TQDM_DISABLE", "1")   # the kernel inherits them
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    said = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert "Launching training on 2" in said, said   # accelerate 1.15 says "2 CUDAs" on a CPU box; the ranks run on gloo
    r0, r1 = (json.loads((tmp_path / "out" / f"run{i}.json").read_text()) for i in (0, 1))
    assert r0["sums"] == r1["sums"] and len(set(r0["sums"])) > 1, (r0["sums"], r1["sums"])
    assert r0["after"] == r1["after"]


if __name__ == "__main__":
    if sys.argv[1] == "run": run_training(sys.argv[2])
    else: run_rank(sys.argv[1])
