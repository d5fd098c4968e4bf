"""Flags shared by every command that loads a model, and the one place that turns them into a model."""

from __future__ import annotations

import argparse

from opscope.engine.cli import args as check
from opscope.engine.core.errors import ConfigError


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model", "-m", default=None, help="GGUF file or Hugging Face directory (default: embedded SmolLM2-135M)"
    )
    g.add_argument("--backend", default="torch", help="backend plugin (see `opscope plugins list`)")
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    g.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    g.add_argument(
        "--threads",
        type=check.threads,
        default=None,
        help=f"CPU threads, 1…{check.logical_cpus()} (default: torch's choice)",
    )
    g.add_argument("--attention", default="sdpa", choices=("sdpa", "naive"))
    g.add_argument(
        "--fastpath",
        default="auto",
        metavar="SPEC",
        help="CPU fast path: auto (on for a float32/bfloat16 GGUF on cpu), off, or settings like "
        "'activations=q8,prefill_dtype=bf16'",
    )
    g.add_argument(
        "--compile",
        default="off",
        choices=("off", "decode"),
        help="decode: torch.compile the plain model's decode step (first reply waits for the "
        "compile, ~35 s on 2 cores; implies --fastpath off)",
    )
    g.add_argument(
        "--quantize",
        default="off",
        choices=("off", "int8", "int4"),
        help="weight-only int8/int4 layer weights for the plain model (the GPU path; implies --fastpath off)",
    )


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 256) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", "-n", type=check.max_tokens, default=max_tokens, help="≥ 1")
    g.add_argument("--temperature", "-t", type=check.temperature, default=0.0, help="≥ 0; 0 = greedy")
    g.add_argument("--top-k", type=check.top_k, default=0, help="0…1000000; 0 = off")
    g.add_argument("--top-p", type=check.top_p, default=1.0, help="(0, 1]; 1 = off")
    g.add_argument("--min-p", type=check.min_p, default=0.0, help="[0, 1); 0 = off")
    g.add_argument("--repetition-penalty", type=check.repetition_penalty, default=1.0, help="> 0; 1 = off")
    g.add_argument("--seed", type=check.seed, default=None, help=f"0…{check.SEED_MAX}")
    g.add_argument(
        "--stop",
        action="append",
        type=check.non_empty("the text that ends the reply"),
        default=[],
        help="stop string (repeatable)",
    )
    g.add_argument("--ignore-eos", action="store_true")


def generation_config(args):
    from opscope.engine.generation.config import GenerationConfig

    return GenerationConfig(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
    )


def load_from_args(args):
    """A loaded model (engine.api.LoadedModel or a plugin's equivalent) from the model flags."""
    backend = getattr(args, "backend", "torch") or "torch"
    kwargs = dict(device=args.device, dtype=args.dtype)
    if backend == "torch":
        from opscope.engine.api import load

        return load(
            args.model,
            attention=args.attention,
            threads=args.threads,
            fastpath=getattr(args, "fastpath", "auto"),
            compile=getattr(args, "compile", "off"),
            quantize=getattr(args, "quantize", "off"),
            **kwargs,
        )
    try:
        from opscope.engine.backends import get_backend
    except ImportError as e:
        raise ConfigError(f"--backend {backend}: backend plugins are not available in this build") from e
    if args.threads is not None:
        kwargs["threads"] = args.threads
    if args.attention != "sdpa":
        kwargs["attention"] = args.attention
    return get_backend(backend).load(args.model, **kwargs)
