#!/usr/bin/env python3
"""The peer for `tokenspeed bench`: HF transformers on the same checkpoint, on the same GPU.

Decode runs as transformers recommends for speed (static KV cache, torch.compile with
mode="reduce-overhead", i.e. CUDA graphs): generate() with a static cache, timed at two output
lengths so the prefill cancels out (per step = (t(n2) - t(n1)) / (n2 - n1)). Prefill is one
eager forward (SDPA attention). The cached-prefix rows time a forward of N new tokens over a
32k-token DynamicCache (eager SDPA), cropped back after each run.

Prints one line per figure and writes JSON (--json) with the same rows as `tokenspeed bench`
(phase, batch, context, tok_s, step_ms) so bench/peers/compare.py can print ratios.
"""
import argparse
import inspect
import json
import sys
import time

import torch


def sync_time(fn, repeats=3):
    """Median wall time of fn() over `repeats` device-synchronised runs (after one warm-up)."""
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-lens", default="1024,8192")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--contexts", default="1024")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--cached-prefix", type=int, default=0, help="also time new tokens after this many cached tokens")
    ap.add_argument("--new-tokens", default="64,2048")
    ap.add_argument("--no-compile", action="store_true", help="eager decode (no torch.compile / CUDA graphs)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(0)
    dev = "cuda"
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev)
    model.eval()
    print(f"peer: transformers loaded {a.model} in {time.perf_counter() - t0:.1f} s "
          f"(torch {torch.__version__}, {torch.cuda.get_device_name()})", flush=True)
    vocab = model.config.vocab_size
    rows = []

    def ids(b, n):
        return torch.randint(0, vocab, (b, n), device=dev)

    # --- prefill: one eager forward of one sequence ---------------------------------------------
    with torch.inference_mode():
        for p in [int(x) for x in a.prompt_lens.split(",") if x]:
            x = ids(1, p)
            s = sync_time(lambda: model(input_ids=x, use_cache=False, logits_to_keep=1))
            rows.append({"phase": "prefill", "batch": 1, "context": p, "time_s": s, "tok_s": p / s})
            print(f"peer: prefill {p} tokens: {s * 1e3:.2f} ms, {p / s:.0f} tok/s", flush=True)

    # --- decode: generate() with a static cache, compiled (CUDA graphs) -------------------------
    # generate() compiles the forward itself when the cache is static (transformers' CompileConfig:
    # inductor, mode "reduce-overhead" = CUDA graphs, fullgraph) and marks each step for the graph
    # tree; compiling model.forward by hand on top of that makes the graph outputs overwrite each
    # other ("accessing tensor output of CUDAGraphs that has been overwritten"). Inductor may still
    # skip the graphs where the cache mutates an input it does not know is static: its warning
    # "skipping cudagraphs due to mutated inputs" then says so in the log.
    n1, n2 = 2, 2 + a.decode_steps
    for b in [int(x) for x in a.batches.split(",") if x]:
        for ctx in [int(x) for x in a.contexts.split(",") if x]:
            x = ids(b, ctx)
            mask = torch.ones_like(x)

            def gen(n):
                gc = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      cache_implementation="static", pad_token_id=0, eos_token_id=None,
                                      disable_compile=a.no_compile)
                # The static cache is sized for the longest run so every call reuses one graph set.
                kw = {}
                if "max_cache_len" in inspect.signature(GenerationConfig.__init__).parameters:
                    kw["max_cache_len"] = ctx + n2 + 8
                return model.generate(input_ids=x, attention_mask=mask, generation_config=gc, **kw)

            try:
                with torch.inference_mode():
                    c0 = time.perf_counter()
                    gen(n2)  # compiles (first call per shape) and warms the graphs
                    torch.cuda.synchronize()
                    compile_s = time.perf_counter() - c0
                    t1 = sync_time(lambda: gen(n1), repeats=3)
                    t2 = sync_time(lambda: gen(n2), repeats=3)
            except Exception as e:  # report, keep going with the other rows
                print(f"peer: decode batch {b} context {ctx} failed: {type(e).__name__}: {e}", flush=True)
                rows.append({"phase": "decode", "batch": b, "context": ctx, "skipped": str(e)[:300]})
                continue
            step = max(t2 - t1, 1e-9) / (n2 - n1)
            rows.append({"phase": "decode", "batch": b, "context": ctx, "step_ms": step * 1e3, "tok_s": b / step,
                         "first_call_s": compile_s})
            print(f"peer: decode batch {b} context {ctx}: {step * 1e3:.3f} ms/step, {b / step:.1f} tok/s "
                  f"(first call incl. compile {compile_s:.1f} s)", flush=True)

    # --- new tokens after a long cached prefix (eager SDPA over a DynamicCache) --------------
    if a.cached_prefix > 0:
        from transformers import DynamicCache
        base = model.forward  # eager: the peer's prefill-over-cache path
        with torch.inference_mode():
            cache = DynamicCache()
            pre = ids(1, a.cached_prefix)
            base(input_ids=pre, past_key_values=cache, use_cache=True, logits_to_keep=1)
            for n in [int(x) for x in a.new_tokens.split(",") if x]:
                x = ids(1, n)
                pos = torch.arange(a.cached_prefix, a.cached_prefix + n, device=dev)

                def run():
                    base(input_ids=x, past_key_values=cache, use_cache=True, cache_position=pos,
                         position_ids=pos[None], logits_to_keep=1)
                    cache.crop(a.cached_prefix)

                s = sync_time(run, repeats=3)
                rows.append({"phase": "cached_prefix", "batch": 1, "context": a.cached_prefix, "new_tokens": n,
                             "time_s": s, "step_ms": s * 1e3})
                print(f"peer: {n} new tokens after {a.cached_prefix} cached: {s * 1e3:.2f} ms", flush=True)

    out = {"peer": "transformers " + __import__("transformers").__version__ + (" eager" if a.no_compile else
                                                                               " static cache + torch.compile (CUDA graphs)"),
           "model": a.model, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
