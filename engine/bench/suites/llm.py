"""llm: llama-bench's pp N and tg N on a real model, plus TTFT, TPOT and ITL from generation.

- ``ppN`` (``ppN@dD``): N synthetic prompt tokens in one forward pass (after D tokens already in
  the KV cache), tokens/s; as in llama-bench only the last position's logits are computed.
- ``tgN`` (``tgN@dD``): N tokens decoded one at a time with the cache, random input tokens, the
  device synchronized after every token as llama-bench does; tokens/s.
- ``e2e_pP_gG``: one full request through LoadedModel.generate (P random prompt tokens, G tokens,
  EOS ignored), with ``ttft``, ``tpot``, ``itl`` (every inter-token latency, pooled) and per-request
  ``itl_p50/p95/p99`` from the engine's own events, so the CLI, the GUI and this suite agree.
- MFU on pp and tg, MBU on tg (weights + KV cache read per step), against the theoretical and the
  measured peaks in settings (engine.bench.utilisation: ``.mfu``, ``.mfu_measured``, ...).

A plugin backend's model (``--backend mlx``) is measured through the backend, never around it: its
pp and tg points time whole requests of its own ``generate`` (ppN: N prompt tokens and the first
token sampled; tgN: N tokens after a one-token prompt); the ``@dD`` points, which fill a torch
model's cache outside generation, are skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from opscope.engine.bench.ceilings import utilisation as U
from opscope.engine.bench.measure.devsync import synchronizer
from opscope.engine.bench.measure.options import DTYPE_BYTES, BenchOptions, SuitePlan
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Extra, Point, skipped_point
from opscope.engine.bench.suites import _model as M

NAME = "llm"
DESCRIPTION = "pp512, tg128 (llama-bench), @d512 depth, TTFT/TPOT/ITL, MFU/MBU, peak memory"
NEEDS_MODEL = True


@dataclass(frozen=True)
class Params:
    pp: int = param(
        512, "Prompt length", "tokens", "Prompt processing (prefill) test: tokens in one forward pass (llama-bench -p)."
    )
    tg: int = param(
        128,
        "Generation length",
        "tokens",
        "Text generation (decode) test: tokens generated one at a time (llama-bench -n).",
    )
    depths: tuple[int, ...] = param(
        (0, 512),
        "Context depths",
        "tokens",
        "Tokens already in the KV cache before the pp and tg tests, one run per "
        "depth (llama-bench -d); 0 is an empty cache.",
    )
    gen_prompt: int = param(
        128,
        "Latency test prompt",
        "tokens",
        "Prompt of the end-to-end generation that measures TTFT, TPOT and inter-token latency.",
    )
    gen_tokens: int = param(
        128, "Latency test length", "tokens", "Tokens generated in the end-to-end TTFT/TPOT/ITL measurement."
    )


QUICK = Params(pp=64, tg=16, depths=(0, 64), gen_prompt=32, gen_tokens=16)


def _suffix(depth: int) -> str:
    return f"@d{depth}" if depth else ""


def pp_work(lm, n: int, depth: int, dtype: str) -> dict[str, float]:
    """FLOP and bytes per token of ppN@dD (engine.bench.roofline): weights read once per pass."""
    cfg = lm.config
    read = weight_bytes(lm) + M.kv_bytes_per_position(cfg, DTYPE_BYTES[dtype]) * (depth + n)
    return {"flop": M.forward_flops(cfg, n, depth, logits_tokens=1) / n, "bytes": read / n}


def tg_work(lm, n: int, depth: int, dtype: str) -> dict[str, float]:
    """FLOP and bytes per token of tgN@dD: every step reads the weights and the cache so far."""
    cfg = lm.config
    flops = sum(M.forward_flops(cfg, 1, depth + i, 1) for i in range(n)) / n
    read = weight_bytes(lm) + M.kv_bytes_per_position(cfg, DTYPE_BYTES[dtype]) * (depth + (n + 1) / 2)
    return {"flop": flops, "bytes": read}


def is_torch(lm) -> bool:
    """The engine's own torch model, tensor-parallel ones ("torch-tp2") included."""
    return str(getattr(lm, "backend_name", "torch")).startswith("torch")


def weight_bytes(lm) -> int:
    """Weight bytes a decode step reads: from the torch model's tensors, or the backend's own count."""
    return M.weight_bytes_per_step(lm.model) if is_torch(lm) else int(lm.memory_stats()["weights_bytes"])


def backend_point(lm, name: str, n_prompt: int, n_gen: int, n: int, opts: BenchOptions, derived) -> Point:
    """``n`` tokens per request of the backend's own generate (``n_prompt`` in, ``n_gen`` out), tok/s."""
    from opscope.engine.generation.events import Finished
    from opscope.engine.generation.generate import GenerationConfig

    def prepare():
        ids = M.random_tokens(n_prompt, lm.config.vocab_size, 2, "cpu")[0].tolist()
        config = GenerationConfig(max_tokens=n_gen, temperature=0.0, ignore_eos=True, reuse_prefix=False)

        def step():
            return next(ev for ev in lm.generate(ids, config) if isinstance(ev, Finished)).stats

        return step

    return Point(
        name,
        "tok/s",
        prepare,
        value=lambda s: n / s,
        params={"n_prompt": n_prompt, "n_gen": n_gen},
        device=opts.device,
        track_memory=True,
        derived=derived,
    )


def backend_points(lm, p: Params, opts: BenchOptions, pk: dict):
    cfg = lm.config
    pp_flops = M.forward_flops(cfg, p.pp, 0, logits_tokens=1)
    tg = tg_work(lm, p.tg, 0, opts.dtype)
    yield backend_point(
        lm,
        f"pp{p.pp}",
        p.pp,
        1,
        p.pp,
        opts,
        U.derived(f"pp{p.pp}", "mfu", lambda tps: tps / p.pp * pp_flops, pk, "flop"),
    )
    yield backend_point(
        lm,
        f"tg{p.tg}",
        1,
        p.tg,
        p.tg,
        opts,
        U.derived(f"tg{p.tg}", "mfu", lambda tps: tps * tg["flop"], pk, "flop")
        + U.derived(f"tg{p.tg}", "mbu", lambda tps: tps * tg["bytes"], pk, "bytes"),
    )
    for depth in (d for d in p.depths if d):
        for kind, n in (("pp", p.pp), ("tg", p.tg)):
            yield skipped_point(
                f"{kind}{n}{_suffix(depth)}",
                "tok/s",
                f"the {lm.backend_name} backend measures whole requests; depth points need --backend torch",
            )
    yield gen_point(lm, p.gen_prompt, p.gen_tokens, opts)


def pp_point(lm, n: int, depth: int, opts: BenchOptions, pk: dict) -> Point:
    cfg, name = lm.config, f"pp{n}{_suffix(depth)}"

    def prepare():
        import torch

        lm.model.setup_cache(1, depth + n)
        M.fill_cache(lm.model, M.random_tokens(depth, cfg.vocab_size, 1, lm.device))
        toks = M.random_tokens(n, cfg.vocab_size, 2, lm.device)

        def step():
            with torch.inference_mode():
                return lm.model(toks, depth, last_only=True)

        return step

    flops = M.forward_flops(cfg, n, depth, logits_tokens=1)
    return Point(
        name,
        "tok/s",
        prepare,
        value=lambda s: n / s,
        params={"n_prompt": n, "depth": depth},
        device=opts.device,
        track_memory=True,
        derived=U.derived(name, "mfu", lambda tps: tps / n * flops, pk, "flop"),
    )


def tg_point(lm, n: int, depth: int, opts: BenchOptions, pk: dict) -> Point:
    cfg, name = lm.config, f"tg{n}{_suffix(depth)}"
    tp = getattr(lm, "tp", None)  # a tensor-parallel model's driver (engine.distributed.tp_worker)

    def prepare():
        import torch
        from opscope.engine.generation.generate import decode_threads

        lm.model.setup_cache(1, depth + n)
        M.fill_cache(lm.model, M.random_tokens(depth, cfg.vocab_size, 1, lm.device))
        toks = M.random_tokens(n, cfg.vocab_size, 3, lm.device)
        sync = synchronizer(opts.device)

        def step():
            if tp is not None:  # tensor-parallel (engine.distributed.tp_worker): this rep's steps only
                tp.reset_meters()
            # decode threads as generation picks them (engine.generate.decode_threads: the model's
            # "auto" gives cores back to busy processes), so tg here equals decode in generation
            with torch.inference_mode(), decode_threads(lm.model) as threads:
                for i in range(n):
                    if threads is not None:
                        threads.step()
                    lm.model(toks[:, i : i + 1], depth + i, last_only=True)
                    sync(None)  # llama-bench waits for every token

        return step

    work = tg_work(lm, n, depth, opts.dtype)
    flops, bytes_ = work["flop"], work["bytes"]
    return Point(
        name,
        "tok/s",
        prepare,
        value=lambda s: n / s,
        params={"n_gen": n, "depth": depth},
        device=opts.device,
        track_memory=True,
        **_tp_observe(tp, name),
        derived=U.derived(name, "mfu", lambda tps: tps * flops, pk, "flop")
        + U.derived(name, "mbu", lambda tps: tps * bytes_, pk, "bytes"),
    )


def _tp_observe(tp, point: str) -> dict[str, Any]:
    """A tensor-parallel tg point's extras: each decode step's share (%) of time inside all_reduce,
    per rank (``<point>.allreduce_pct_rR``), read from every rank after the timed rep."""
    if tp is None:
        return {}

    def observe(_out) -> dict[str, Any]:
        return {f"{point}.allreduce_pct_r{r}": m["allreduce_pct"] for r, m in enumerate(tp.read_meters())}

    return {"observe": observe, "extras": tuple(Extra(f"{point}.allreduce_pct_r{r}", "%") for r in range(tp.world))}


def _gen_observe(n_gen: int):
    def observe(stats) -> dict[str, Any]:
        if stats.generated_tokens != n_gen:
            raise RuntimeError(f"generation stopped after {stats.generated_tokens} of {n_gen} tokens")
        itl = np.asarray(stats.itl_ms)
        p50, p95, p99 = np.percentile(itl, (50, 95, 99), method="linear") if itl.size else (np.nan,) * 3
        out = {
            "ttft": stats.ttft_ms,
            "tpot": stats.tpot_ms,
            "itl": list(stats.itl_ms),
            "itl_p50": p50,
            "itl_p95": p95,
            "itl_p99": p99,
            "decode": stats.decode_tok_s,
        }
        for key in ("prefill_j_per_token", "decode_j_per_token"):  # engine.energy; absent where N/A
            v = getattr(stats, key, float("nan"))
            if np.isfinite(v):
                out[key] = v
        return out

    return observe


def energy_meter(device: str):
    from opscope.engine.telemetry import energy

    return energy.meter_for(device)


def energy_setting(device: str) -> str:
    """What the J/token figures come from, or why there are none (shown under the table)."""
    m = energy_meter(device)
    return (
        f"J/token from {m.source} (the whole package/board, other processes included)"
        if m.available
        else f"J/token N/A: {m.reason}"
    )


def gen_point(lm, n_prompt: int, n_gen: int, opts: BenchOptions) -> Point:
    from opscope.engine.generation.events import Finished
    from opscope.engine.generation.generate import GenerationConfig

    def prepare():
        ids = M.random_tokens(n_prompt, lm.config.vocab_size, 4, "cpu")[0].tolist()
        config = GenerationConfig(max_tokens=n_gen, temperature=0.0, ignore_eos=True, reuse_prefix=False)

        def step():
            for ev in lm.generate(ids, config):
                if isinstance(ev, Finished):
                    return ev.stats
            raise RuntimeError("generation ended without a Finished event")

        return step

    extras = tuple(Extra(n, "ms") for n in ("ttft", "tpot", "itl", "itl_p50", "itl_p95", "itl_p99"))
    if energy_meter(opts.device).available:
        extras += (Extra("prefill_j_per_token", "J/tok"), Extra("decode_j_per_token", "J/tok"))
    return Point(
        f"e2e_p{n_prompt}_g{n_gen}",
        "ms",
        prepare,
        value=lambda s: s * 1e3,
        higher_is_better=False,
        params={"n_prompt": n_prompt, "n_gen": n_gen},
        device=opts.device,
        track_memory=True,
        observe=_gen_observe(n_gen),
        extras=extras + (Extra("decode", "tok/s", True),),
    )


def _points(lm, p: Params, opts: BenchOptions, pk: dict):
    if not is_torch(lm):
        yield from backend_points(lm, p, opts, pk)
        return
    ctx = lm.config.max_seq_len
    for depth in p.depths:
        for kind, n, make in (("pp", p.pp, pp_point), ("tg", p.tg, tg_point)):
            if depth + n > ctx:
                yield skipped_point(
                    f"{kind}{n}{_suffix(depth)}", "tok/s", f"needs {depth + n} positions, the model has {ctx}"
                )
            else:
                yield make(lm, n, depth, opts, pk)
    yield gen_point(lm, p.gen_prompt, p.gen_tokens, opts)


def load_any(opts: BenchOptions):
    """The torch model (engine.api.load), or the plugin backend's own model for other backends."""
    if opts.backend == "torch":
        return M.load_model(opts)
    from opscope.engine.backends import get_backend

    kwargs = {"threads": opts.threads} if opts.threads is not None else {}
    return get_backend(opts.backend).load(opts.model, device=opts.device, dtype=opts.dtype, **kwargs)


def _roofline_work(lm, p: Params, opts: BenchOptions) -> dict[str, dict[str, float]]:
    """FLOP and bytes per token of every pp/tg point that fits the context (for the roofline)."""
    out = {}
    for depth in p.depths:
        for kind, n, work in (("pp", p.pp, pp_work), ("tg", p.tg, tg_work)):
            if depth + n <= lm.config.max_seq_len:
                out[f"{kind}{n}{_suffix(depth)}"] = work(lm, n, depth, opts.dtype)
    return out


def plan(opts: BenchOptions, params: Params | None = None, model: Any = None) -> SuitePlan:
    p = params or (QUICK if opts.quick else Params())
    lm = model if model is not None else load_any(opts)
    pk = M.model_peaks(opts)
    settings = {
        "pp": p.pp,
        "tg": p.tg,
        "depths": list(p.depths),
        "gen_prompt": p.gen_prompt,
        "gen_tokens": p.gen_tokens,
        "peaks": pk,
        "model_memory": lm.memory_stats(),
        "weights_bytes_per_decode_step": weight_bytes(lm),
        "backend": opts.backend,
        "model": lm.describe() if hasattr(lm, "describe") else {},
        "roofline": _roofline_work(lm, p, opts),
        "energy": energy_setting(opts.device),
    }
    close = None if model is not None or not is_torch(lm) else (lambda: lm.model.drop_cache())
    return SuitePlan(
        points=_points(lm, p, opts, pk),
        n_points=2 * len(p.depths) + 1,
        settings=settings,
        model_source=lm.source,
        close=close,
    )
