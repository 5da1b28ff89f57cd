"""labmod's GRPO loss and gradients equal TRL GRPOTrainer's on identical single-turn inputs.

TRL's own code computes its side: a real `trl.GRPOTrainer` on the tiny model (CPU, float32) whose
`compute_loss` gets the inputs dict its generation step would build (left-padded prompts, right-padded
completions, advantages, old and reference per-token log-probs). Prompts have equal lengths because TRL
left-pads prompts without shifting position ids, while labmod right-pads (positions 0..n-1): with equal
prompt lengths both layouts feed the model the same positions.
"""
import copy

import pytest
import torch

from labmod.rl.config import GRPOConfig
from labmod.rl.losses import collate, grpo_loss, token_logprobs
from labmod.rl.samples import Sample
from labmod.models import tiny_causal_lm

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402

PROMPT_LEN = 6
COMPLETIONS = [[11, 12, 13, 14, 15], [21, 22], [31, 32, 33], [41, 42, 43, 44, 45, 46, 47], [51], [61, 62, 63, 64]]
REWARDS_ADV = [1.2, -0.4, 0.7, -1.5, 0.9, -0.1]


def _trl_trainer(model_dir, tok, loss_type, beta, temperature, tmp_path):
    args = trl.GRPOConfig(output_dir=str(tmp_path / f"trl-{loss_type}-{beta}"), use_cpu=True, bf16=False, fp16=False,
                          per_device_train_batch_size=6, num_generations=3, gradient_accumulation_steps=1,
                          loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28, temperature=temperature,
                          max_completion_length=8, report_to="none", gradient_checkpointing=False, logging_steps=1,
                          save_strategy="no", seed=0)
    ds = Dataset.from_dict({"prompt": ["a b c"] * 6})
    trainer = trl.GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=args, train_dataset=ds, processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl_eq")
    model, tok = tiny_causal_lm(seed=0)
    model.save_pretrained(tmp / "policy"); tok.save_pretrained(tmp / "policy")
    ref = copy.deepcopy(model)
    with torch.no_grad():   # a reference policy that differs from the policy, so the KL term is not zero
        for p in ref.parameters(): p.add_(0.02 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 1000, (PROMPT_LEN,), generator=g).tolist() for _ in COMPLETIONS]
    return tmp, model, tok, ref, prompts


def _inputs(model, ref, prompts, temperature, pad_id):
    "Samples for labmod and the equivalent TRL inputs dict, with off-policy old log-probs (ratios != 1)."
    samples = [Sample(p + c, [0] * len(p) + [1] * len(c), [0.0] * (len(p) + len(c)), a)
               for p, c, a in zip(prompts, COMPLETIONS, REWARDS_ADV)]
    b = collate(samples, pad_id)
    with torch.no_grad():
        cur = token_logprobs(model, b["input_ids"], b["attention_mask"], temperature)[0]
        ref_lp = token_logprobs(ref, b["input_ids"], b["attention_mask"], temperature)[0] * b["loss_mask"]
    g = torch.Generator().manual_seed(1)
    old = (cur + 0.3 * torch.randn(cur.shape, generator=g)) * b["loss_mask"]   # some ratios get clipped
    b["old_logprobs"], b["ref_logprobs"] = old, ref_lp
    T = max(len(c) for c in COMPLETIONS)
    comp = torch.full((len(samples), T), pad_id); cmask = torch.zeros(len(samples), T, dtype=torch.long)
    for i, c in enumerate(COMPLETIONS): comp[i, :len(c)] = torch.tensor(c); cmask[i, :len(c)] = 1
    sl = slice(PROMPT_LEN, PROMPT_LEN + T)
    pad_to = lambda x: torch.nn.functional.pad(x, (0, PROMPT_LEN + T - x.shape[1]))[:, sl]
    trl_inputs = dict(prompt_ids=torch.tensor(prompts), prompt_mask=torch.ones(len(prompts), PROMPT_LEN, dtype=torch.long),
                      completion_ids=comp, completion_mask=cmask, advantages=torch.tensor(REWARDS_ADV),
                      old_per_token_logps=pad_to(old), ref_per_token_logps=pad_to(ref_lp),
                      num_items_in_batch=cmask.sum())
    return b, trl_inputs


@pytest.mark.parametrize("loss_type,beta,temperature", [("grpo", 0.0, 1.0), ("dapo", 0.0, 1.0), ("grpo", 0.04, 0.7),
                                                        ("dapo", 0.04, 1.0), ("bnpo", 0.04, 0.9)])
def test_grpo_loss_and_grads_match_trl(setup, loss_type, beta, temperature):
    tmp, model, tok, ref, prompts = setup
    ours = copy.deepcopy(model).train()
    b, trl_inputs = _inputs(ours, ref, prompts, temperature, tok.pad_token_id)
    cfg = GRPOConfig(loss_type=loss_type, beta=beta, temperature=temperature, epsilon_low=0.2, epsilon_high=0.28)
    loss, stats = grpo_loss(ours, b, cfg)
    loss.backward()
    assert stats["clip_fraction"] > 0, "the test inputs should exercise clipping"

    trainer = _trl_trainer(tmp / "policy", tok, loss_type, beta, temperature, tmp)
    theirs = trainer.model.train()
    # same weights on both sides before the loss
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters()): assert torch.equal(p.detach(), q.detach()), n
    trl_loss = trainer.compute_loss(theirs, trl_inputs)
    trl_loss.backward()

    assert abs(loss.item() - trl_loss.item()) < 1e-5, (loss.item(), trl_loss.item())
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{n}: {m}")
    # the logged statistics agree too
    m = trainer._metrics["train"]
    assert abs(m["entropy"][-1] - stats["entropy"]) < 1e-4
    assert abs(m["clip_ratio/high_mean"][-1] - stats["clip_high"]) < 1e-6
    assert abs(m["clip_ratio/low_mean"][-1] - stats["clip_low"]) < 1e-6
    if beta: assert abs(m["kl"][-1] - stats["kl"]) < 1e-6


def test_token_logprobs_match_trl(setup):
    "labmod's per-token log-probs (logits / temperature) equal TRL's fused LM head's."
    tmp, model, tok, ref, prompts = setup
    trainer = _trl_trainer(tmp / "policy", tok, "dapo", 0.0, 0.7, tmp)
    b, ti = _inputs(model, ref, prompts, 0.7, tok.pad_token_id)
    ids = torch.cat([ti["prompt_ids"], ti["completion_ids"]], 1); am = torch.cat([ti["prompt_mask"], ti["completion_mask"]], 1)
    with torch.no_grad():
        theirs, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model.eval(), ids, am, ti["completion_ids"].shape[1])
        ours = token_logprobs(model.eval(), b["input_ids"], b["attention_mask"], 0.7)[0]
    T = ti["completion_ids"].shape[1]
    ours = torch.nn.functional.pad(ours, (0, PROMPT_LEN + T - ours.shape[1]))[:, PROMPT_LEN:]
    torch.testing.assert_close(ours * ti["completion_mask"], theirs * ti["completion_mask"], atol=1e-5, rtol=1e-5)
