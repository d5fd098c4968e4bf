"""Batched generation of several prompts for throughput work: left padding + a key mask.

Rows are left-padded to the longest prompt; ``pad`` tells the model how many leading tokens of
each row to mask and where its positions start, so every row sees exactly what it would alone.
Yields the same event types as single generation, Token.seq naming the row. Each row stops on its
own EOS or stop string (engine.decode_book); the batch ends when every row has, at ``max_tokens`` or
on ``cancel``. Finished carries row 0's text and finish reason, and J/token where a counter is
readable (engine.energy): prefill joules over the rows' prompt tokens (padding is work, not tokens
anyone asked for), decode joules over the tokens the rows decoded after their first (each row's
first comes from the prefill's logits).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.generation.config import GenerationConfig
from opscope.engine.generation.decode_book import DecodeBook, decode_events
from opscope.engine.generation.events import Event, Finished, PrefillFinished, PrefillStarted, Token
from opscope.engine.generation.generate import ensure_cache
from opscope.engine.generation.sampling import sample
from opscope.engine.telemetry import energy

if TYPE_CHECKING:
    from opscope.engine.models.transformer import Transformer
    from opscope.engine.tokenizer.loader import Tokenizer


def generate_batch(
    model: Transformer,
    tokenizer: Tokenizer,
    prompts: list[list[int]],
    cfg: GenerationConfig = GenerationConfig(),
    cancel: threading.Event | None = None,
) -> Iterator[Event]:
    request_ns = now_ns()
    B, L = len(prompts), max(len(p) for p in prompts)
    ensure_cache(model, B, L + cfg.max_tokens)
    device = model.embed.weight.device
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
    rows = [[tokenizer.pad_id] * (L - len(p)) + list(p) for p in prompts]
    with torch.inference_mode():
        ids = torch.tensor(rows, dtype=torch.long, device=device)  # [B,L]
        pad = torch.tensor([L - len(p) for p in prompts], device=device)  # [B]
        meter = energy.meter_for(device)
        prefill_energy = meter.span()
        t0 = now_ns()
        yield PrefillStarted(B * L, t0, request_ns)
        with markers.phase(markers.PREFILL, tokens=B * L, batch=B):
            logits = model(ids, 0, pad=pad, last_only=True)
            nxt = sample(logits[:, -1], cfg.sampling, None, gen)  # [B]
            out = nxt.tolist()  # sync
        t_prefill = now_ns()
        prefill_j, decode_energy = prefill_energy.joules(), meter.span()
        yield PrefillFinished(B * L, t_prefill)
        book = DecodeBook(tokenizer, cfg, B * L, (request_ns, t0, t_prefill), cancel, rows=B, batch=B)

        def advance(i: int, ids: list[int]) -> list[int]:
            nonlocal nxt
            logits = model(nxt.view(B, 1), L + i, pad=pad)
            nxt = sample(logits[:, -1], cfg.sampling, None, gen)
            return list(nxt.tolist())  # the step's one sync

        per_row = [0] * B  # tokens each row produced
        for event in decode_events(book, out, advance):
            if isinstance(event, Token):
                per_row[event.seq] += 1
            elif isinstance(event, Finished):
                decoded = sum(max(0, n - 1) for n in per_row)
                event = energy.with_energy_over(
                    event, meter, prefill_j, sum(len(p) for p in prompts), decode_energy.joules(), decoded
                )
            yield event
