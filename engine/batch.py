"""Batched generation of several prompts for throughput work: left padding + a key mask.

Rows are left-padded to the longest prompt; ``pad`` tells the model how many leading tokens of
each row to mask and where its positions start, so every row sees exactly what it would alone.
Yields the same event types as single generation, Token.seq naming the row.
"""
from __future__ import annotations

import threading
from typing import Iterator

import torch

from engine import markers
from engine.clock import now_ns
from engine.events import Finished, PrefillFinished, PrefillStarted, Token, stats_from_times
from engine.generate import ensure_cache
from engine.generation_config import GenerationConfig
from engine.sampling import sample


def generate_batch(model, tokenizer, prompts: list[list[int]], cfg: GenerationConfig = GenerationConfig(),
                   cancel: threading.Event | None = None) -> Iterator:
    request_ns = now_ns()
    B, L = len(prompts), max(len(p) for p in prompts)
    ensure_cache(model, B, L + cfg.max_tokens)
    device = model.embed.weight.device
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
    rows = [[tokenizer.pad_id] * (L - len(p)) + list(p) for p in prompts]
    eos = torch.tensor(sorted(tokenizer.eos_ids) or [-1], device=device)
    with torch.inference_mode():
        ids = torch.tensor(rows, dtype=torch.long, device=device)  # [B,L]
        pad = torch.tensor([L - len(p) for p in prompts], device=device)  # [B]
        t0 = now_ns()
        yield PrefillStarted(B * L, t0, request_ns)
        with markers.phase(markers.PREFILL, tokens=B * L, batch=B):
            logits = model(ids, 0, pad=pad, last_only=True)
            nxt = sample(logits[:, -1], cfg.sampling, None, gen)  # [B]
            out = nxt.tolist()  # sync
        t_prefill = now_ns()
        yield PrefillFinished(B * L, t_prefill)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        texts, token_ns, reason = [[] for _ in range(B)], [], "length"
        markers.emit(markers.DECODE, "start", t_prefill, batch=B)
        for i in range(cfg.max_tokens):
            t = now_ns() if i else t_prefill
            if not cfg.ignore_eos:
                done |= torch.isin(nxt, eos)
            finished = done.tolist()
            if all(finished):
                reason = "eos"
                break
            token_ns.append(t)
            for b, tok in enumerate(out):
                if not finished[b]:
                    texts[b].append(tok)
                    yield Token(i, tok, "", t, seq=b)
            if (cancel is not None and cancel.is_set()) or i + 1 == cfg.max_tokens:
                reason = "cancelled" if cancel is not None and cancel.is_set() else "length"
                break
            logits = model(nxt.view(B, 1), L + i, pad=pad)
            nxt = sample(logits[:, -1], cfg.sampling, None, gen)
            out = nxt.tolist()
        end = now_ns()
        markers.emit(markers.DECODE, "end", end, batch=B)
    stats = stats_from_times(request_ns, t0, t_prefill, B * L, token_ns or [t_prefill], end)
    yield Finished(reason, stats, end, text=tokenizer.decode(texts[0]))
