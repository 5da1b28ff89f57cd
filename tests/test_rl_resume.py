"""A GRPO run SIGKILLed mid-way and resumed from its last checkpoint ends with the same weights and the same logs
as an uninterrupted run (checkpoints restore weights, optimizer, scheduler, RNG and the task cursor; resume drops
the rows the killed run logged after its last checkpoint).

Run as a script (`python tests/test_rl_resume.py RUN_DIR STEPS`) it is the training process itself.
"""
import os, signal, subprocess, sys, time
from pathlib import Path

import torch

STEPS = 8
CHECKPOINT_EVERY = 3      # so the killed run has logged updates past its last checkpoint, which resume must drop
TIMING = {"time", "collect_time", "update_time", "tokens_per_s", "wall_time"}   # the only fields allowed to differ


def train(run_dir: str, steps: int, lora: bool = False):
    from labmod.core import Task
    from labmod.rl.config import GRPOConfig, RunConfig
    from labmod.rl.trainer import PolicyTrainer, seed_everything
    from labmod.rl.run import target_token_collect, train_loop
    from labmod.models import tiny_causal_lm
    from labmod.lab.store import RunStore
    torch.set_num_threads(1)   # same thread count in every process: CPU kernels then give identical bits
    seed_everything(0)
    model, tok = tiny_causal_lm(seed=0)
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    targets = {i for i in range(len(tok)) if "o" in tok.decode([i])}
    cfg = GRPOConfig(lr=3e-3, micro_batch_size=4, lr_scheduler="linear", total_steps=steps, num_iterations=2)
    trainer = PolicyTrainer(model, tok, cfg)
    tasks = [Task(f"toy-{i}", "toy", instruction=f"say o {i}:") for i in range(3)]
    run = RunConfig(steps=steps, groups_per_step=2, dynamic_sampling=True, max_gen_batches=3, checkpoint_every=CHECKPOINT_EVERY,
                    save_trajectories=True, progress=False)
    train_loop(trainer, target_token_collect(model, tok, targets, group_size=4, max_new_tokens=4), tasks, run, store=RunStore(run_dir))
    trainer.save_checkpoint(Path(run_dir) / "final")
    return trainer


def _final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(run_dir / "final" / "model.safetensors")


def _untimed(rec: dict) -> dict: return {k: v for k, v in rec.items() if k not in TIMING}


def _untimed_traj(tr: dict) -> dict:
    "A trajectory record without its wall-clock fields (`created`, each turn's `timings`)."
    return {**{k: v for k, v in tr.items() if k != "created"}, "turns": [{k: v for k, v in t.items() if k != "timings"} for t in tr["turns"]]}


def _script(run_dir: Path, steps: int):
    return subprocess.Popen([sys.executable, __file__, str(run_dir), str(steps)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "TQDM_DISABLE": "1"})


def test_sigkill_and_resume_matches_uninterrupted(tmp_path):
    full = _script(tmp_path / "full", STEPS)
    out, _ = full.communicate(timeout=600)
    assert full.returncode == 0, out.decode()[-3000:]

    from labmod.lab.store import RunStore
    killed = _script(tmp_path / "killed", STEPS)
    ck = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 600
    # let it checkpoint (update 3) and log at least one more update, then kill it between checkpoints
    while not ((ck / "ckpt-000003").exists() and len(RunStore(tmp_path / "killed").metrics()) >= 4):
        assert killed.poll() is None, killed.stdout.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL); killed.wait()
    assert not (tmp_path / "killed" / "final").exists(), "the run finished before it could be killed"
    logged_when_killed = len(RunStore(tmp_path / "killed").metrics())
    resumed = _script(tmp_path / "killed", STEPS)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out.decode()[-3000:]

    m = RunStore(tmp_path / "full").metrics()
    assert [r["step"] for r in m] == list(range(1, STEPS + 1)) and all("frac_filtered" in r and "kl" not in r for r in m)
    assert all(r["gen_batches"] >= 1 and (r.get("skipped_update") or r["tokens_per_s"] > 0) for r in m)
    assert sum("tokens_per_s" in r for r in m) >= STEPS // 2
    # the resumed run's logs are the uninterrupted run's: same updates in the same order, same values
    m2 = RunStore(tmp_path / "killed").metrics()
    assert logged_when_killed > CHECKPOINT_EVERY and [r["step"] for r in m2] == [r["step"] for r in m]
    assert [_untimed(r) for r in m2] == [_untimed(r) for r in m]
    ta, tb = (RunStore(tmp_path / d).read("trajectories") for d in ("full", "killed"))
    assert ta and {t["metadata"]["update"] for t in ta} <= set(range(1, STEPS + 1))
    assert [_untimed_traj(t) for t in tb] == [_untimed_traj(t) for t in ta]
    a, b = _final_weights(tmp_path / "full"), _final_weights(tmp_path / "killed")
    assert a.keys() == b.keys()
    for k in a: assert torch.equal(a[k], b[k]), k
    # and training changed the weights at all
    from labmod.models import tiny_causal_lm
    init = tiny_causal_lm(seed=0)[0].state_dict()
    assert any(not torch.equal(a[k], init[k]) for k in a if k in init)


def test_lora_checkpoint_round_trip(tmp_path):
    "A PEFT model checkpoints its adapters only, and a fresh trainer continues identically."
    from labmod.rl.config import GRPOConfig, RunConfig
    from labmod.rl.trainer import PolicyTrainer, seed_everything
    from labmod.rl.samples import Sample
    from labmod.models import tiny_causal_lm
    from peft import LoraConfig, get_peft_model
    samples = [Sample([5, 6, 7, 8], [0, 0, 1, 1], [0.0] * 4, 1.0), Sample([5, 6, 9], [0, 0, 1], [0.0] * 3, -1.0)]
    def make():
        seed_everything(0); m, tok = tiny_causal_lm(seed=0)
        m = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
        return m, PolicyTrainer(m, tok, GRPOConfig(lr=1e-2, num_iterations=2))
    m1, t1 = make()
    t1.update(samples); t1.save_checkpoint(tmp_path / "ck")
    assert (tmp_path / "ck" / "adapter" / "adapter_config.json").exists()
    assert not (tmp_path / "ck" / "model.safetensors").exists()
    t1.update(samples)
    m2, t2 = make()
    t2.load_checkpoint(tmp_path / "ck"); t2.update(samples)
    assert t2.step == 2
    for (n, p), q in zip(m1.named_parameters(), m2.parameters()): assert torch.equal(p, q), n
    # the adapters moved and the base weights did not
    base = tiny_causal_lm(seed=0)[0].state_dict()
    sd = m1.state_dict()
    assert torch.equal(sd["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"],
                       base["model.layers.0.self_attn.q_proj.weight"])
    assert sd["base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"].abs().sum() > 0


if __name__ == "__main__":
    train(sys.argv[1], int(sys.argv[2]))
