"""GPU paths on a lent GPU box, in under 5 minutes: bf16 full fine-tuning and bf16 LoRA GRPO updates with the
`hf` backend, generation tokens/s, peak memory; the `unsloth` and `vllm` backends where installed.

`--random-init DIR` runs the same checks on a model with DIR's architecture and tokenizer but random weights
(for a box the weights cannot reach: throughput and memory do not depend on the weights' values), and
`--scale-8b` adds LoRA GRPO and generation on a Llama-3.1-8B-shaped random model (the paper's experience model
size), built directly on the GPU.

Each check prints one `RESULT name key=value ...` line (or `SKIP name: why`), so a log reads as a table.
The GRPO task is the toy verifiable one from labmod.rl (reward = share of completion tokens in a target
set), which needs no environment, so the figures are those of the model and trainer alone.

    python benchmarks/gpu_check.py [--model smollm2-135m] [--updates 6] [--batch 64]
"""
import argparse, importlib.util, json, time, traceback
from pathlib import Path
import torch
from labmod.core import Task
from labmod.models import HFLM, VLLMOptions, _apply_lora, avoid_cudnn_attention, load_lm, lora_settings
from labmod import rl
from labmod.rl.run import target_token_collect, train_loop

LLAMA_31_8B = dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=False)


DEVICE = "cuda"

def sync():
    if DEVICE == "cuda": torch.cuda.synchronize()


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else float("nan")


def grpo_updates(lm, args, label):
    tok = lm.tokenizer
    target = {i for i in range(len(tok)) if "o" in tok.decode([i])}
    tasks = [Task(f"toy-{i}", "toy", instruction=f"say o {i}:") for i in range(args.batch // args.group)]
    cfg = rl.GRPOConfig(lr=args.lr, micro_batch_size=args.micro_batch)
    trainer = rl.PolicyTrainer(lm.model, tok, cfg)
    collect = target_token_collect(lm.model, tok, target, group_size=args.group, max_new_tokens=args.new_tokens)
    if DEVICE == "cuda": torch.cuda.reset_peak_memory_stats()
    hist = train_loop(trainer, collect, tasks, rl.RunConfig(steps=args.updates, groups_per_step=len(tasks), dynamic_sampling=False, progress=False))
    tail = hist[1:] or hist                      # the first update pays for kernel warm-up
    tok_s = sum(h.get("tokens_per_s", 0) for h in tail) / len(tail)
    print(f"RESULT {label} updates={len(hist)} update_tokens_per_s={tok_s:.0f} "
          f"update_s={sum(h.get('update_time', 0) for h in tail) / len(tail):.2f} "
          f"collect_s={sum(h['collect_time'] for h in tail) / len(tail):.2f} "
          f"reward_first={hist[0]['reward_mean']:.3f} reward_last={hist[-1]['reward_mean']:.3f} "
          f"peak_mem_gib={peak_gib():.2f} "
          f"dtype={next(lm.model.parameters()).dtype}", flush=True)


def random_lm(folder: str, lora: dict | None, overrides: dict | None = None) -> HFLM:
    "An HFLM with `folder`'s tokenizer and architecture (plus `overrides`) and random bf16 weights made on the GPU."
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token_id is None: tok.pad_token = tok.eos_token
    if overrides:
        base = json.loads((Path(folder) / "config.json").read_text())
        ids = {k: base[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in base}
        cfg = AutoConfig.for_model(**{**overrides, **ids, "vocab_size": len(tok)})
    else: cfg = AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    with torch.device(DEVICE): model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    avoid_cudnn_attention()
    lm = HFLM.__new__(HFLM)   # HFLM loads weights from a folder; here they are made in place, the rest is the same
    lm.name, lm.path, lm.device, lm.tokenizer = f"random:{folder}", folder, DEVICE, tok
    lm.model = _apply_lora(model, lora_settings(lora)) if lora else model
    n = sum(p.numel() for p in model.parameters())
    print(f"     random {cfg.model_type} model: {n / 1e9:.2f}B parameters, bf16", flush=True)
    return lm


def generation(lm, args, label):
    prompts = [lm.tokenizer(f"Tell me about item {i}.", add_special_tokens=False).input_ids for i in range(args.batch)]
    lm.generate(prompts[:4], max_new_tokens=8)                 # warm-up
    sync(); t = time.perf_counter()
    outs = lm.generate(prompts, max_new_tokens=args.gen_tokens, temperature=1.0)
    sync(); dt = time.perf_counter() - t
    n = sum(len(o.token_ids) for o in outs)
    print(f"RESULT {label} prompts={len(prompts)} new_tokens={n} tokens_per_s={n / dt:.0f} wall_s={dt:.2f}", flush=True)


def check(name, fn):
    t = time.perf_counter()
    try: fn()
    except Exception as e:
        print(f"FAIL {name}: {type(e).__name__}: {e}"); traceback.print_exc()
    finally:
        print(f"     {name} took {time.perf_counter() - t:.1f}s", flush=True)
        if DEVICE == "cuda": torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--updates", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64, help="completions per update (and prompts for generation)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the same code paths (no GPU figures)")
    ap.add_argument("--random-init", default="", help="model folder: its tokenizer and architecture, random weights")
    ap.add_argument("--scale-8b", action="store_true", help="add LoRA GRPO + generation on a Llama-3.1-8B-shaped random model")
    ap.add_argument("--batch-8b", type=int, default=64)
    args = ap.parse_args()
    global DEVICE; DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA GPU: torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}; the CPU build cannot see a GPU, install a CUDA build of torch)")
    if DEVICE == "cuda":
        p = torch.cuda.get_device_properties(0)
        print(f"GPU {p.name} {p.total_memory / 2**30:.0f} GiB x{torch.cuda.device_count()} torch {torch.__version__} "
              f"bf16={torch.cuda.is_bf16_supported()}", flush=True)

    def hf_full():
        lm = load_lm(args.model, backend="hf", device=DEVICE, dtype="bfloat16")
        generation(lm, args, "hf_generate_bf16"); grpo_updates(lm, args, "hf_grpo_full_bf16")
    def hf_lora():
        lm = load_lm(args.model, backend="hf", device=DEVICE, dtype="bfloat16", lora={"r": 16})
        grpo_updates(lm, args, "hf_grpo_lora_r16_bf16")
    def random_full():
        lm = random_lm(args.random_init, None)
        generation(lm, args, "random_generate_bf16"); grpo_updates(lm, args, "random_grpo_full_bf16")
    def random_lora():
        grpo_updates(random_lm(args.random_init, {"r": 16}), args, "random_grpo_lora_r16_bf16")
    def scale_8b():
        lm = random_lm(args.random_init, {"r": 16}, LLAMA_31_8B)
        a8 = argparse.Namespace(**{**vars(args), "batch": args.batch_8b, "updates": 3, "micro_batch": 16})
        generation(lm, a8, "llama8b_lora_generate_bf16"); grpo_updates(lm, a8, "llama8b_grpo_lora_r16_bf16")
    def unsloth_lora():
        lm = load_lm(args.model, backend="unsloth", lora={"r": 16})
        generation(lm, args, "unsloth_generate_lora_r16")      # UnslothLM.generate: its for_inference fast path
        grpo_updates(lm, args, "unsloth_grpo_lora_r16")
    def vllm_generate():
        lm = load_lm(args.model, backend="vllm", options=VLLMOptions(gpu_memory_utilization=0.3))
        generation(lm, args, "vllm_generate")
        lm.sync_weights(); print("RESULT vllm_sync_weights ok=1", flush=True)

    check("hf_full", hf_full)
    check("hf_lora", hf_lora)
    if args.random_init:
        check("random_full", random_full); check("random_lora", random_lora)
        if args.scale_8b: check("scale_8b", scale_8b)
    for name, fn, module in (("unsloth_lora", unsloth_lora, "unsloth"), ("vllm_generate", vllm_generate, "vllm")):
        if importlib.util.find_spec(module) is None: print(f"SKIP {name}: {module} is not installed (pip install -e '.[{module}]')")
        else: check(name, fn)


if __name__ == "__main__":
    main()
