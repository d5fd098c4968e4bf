"""KL(exact prefill || q8 prefill, int8 GEMMs where the kernels have them, and q8 with bf16 prefill) on
benchmarks/gguf_types.py's files of each type: the first 512 tokens of GPL-3 in one forward pass.

    .venv/bin/python benchmarks/prefill_kl_types.py Q4_0,Q6_K,Q2_K,Q4_K_M
"""

import sys
from pathlib import Path

import torch
from opscope.engine.api import load

torch.set_num_threads(2)
text = Path("/usr/share/common-licenses/GPL-3").read_text()
for t in sys.argv[1].split(","):
    path = str(Path.home() / f".cache/opscope/gguf_types/SmolLM2-135M-Instruct.{t}.gguf")
    out = {}
    for name, spec in (("exact", "auto"), ("q8", "activations=q8"), ("q8bf16", "activations=q8,prefill_dtype=bf16")):
        lm = load(path, fastpath=spec, threads=2)
        ids = lm.tokenizer.encode(text)[:512]
        with torch.inference_mode():
            lm.model.setup_cache(1, 1024)
            out[name] = lm.model(torch.tensor([ids]), 0).float().log_softmax(-1)[0]
    ref = out["exact"]
    for name in ("q8", "q8bf16"):
        kl = (ref.exp() * (ref - out[name])).sum(-1)
        top1 = (ref.argmax(-1) == out[name].argmax(-1)).float().mean()
        print(f"{t} {name}: KL mean {kl.mean():.2e} p99 {kl.quantile(0.99):.2e} top-1 {top1:.3f}")
