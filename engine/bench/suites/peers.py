"""peers: OpScope against llama.cpp (its own llama-bench, or llama-cpp-python) and Hugging Face
transformers on the same GGUF.

Every repetition is one round that runs each peer once, in alternating order (A B C, C B A, ...),
so load from other jobs hits all peers alike; each peer's figure and its ratio to OpScope are
kept per round (raw samples: median and spread come from them). llama-bench semantics:

- ``ppN``: N synthetic prompt tokens in one batch into an empty cache, tokens/s.
- ``tgN``: N tokens decoded one at a time from an empty cache, tokens/s.
- ``load``: opening the model file until it can run, ms (a fresh load per round).

Metrics are ``<test>.<peer>`` (tok/s or ms) and ``<test>.ratio.<peer>`` = OpScope / peer for
throughput (>1: OpScope faster) and peer / OpScope for load time (>1: OpScope loads faster).
Peers: ``opscope`` (engine with its default CPU fast path), ``opscope:<fast-path settings>`` (e.g.
``opscope:weights=dense`` or ``opscope:fused_decode=0``: each fast path's own effect),
``llama_bench`` (llama.cpp's own ``llama-bench`` binary, one child process per round:
``llama-bench -m FILE -p N -n 0`` for pp and ``-p 0 -n N`` for tg, ``-t THREADS -r 1 -o json``; the
figure is llama-bench's own sample, its load and warm-up excluded), ``llama_cpp`` (llama-cpp-python),
``hf_fp32``, ``hf_bf16``. The llama-bench binary: the ``llama_bench`` parameter, else the
``OPSCOPE_LLAMA_BENCH`` environment variable, else ``llama-bench`` on PATH; a path that is set but
missing or broken is a ConfigError. Peers that are not installed (the optional ``peers`` extra:
``pip install -e '.[peers]'``, or no llama-bench anywhere) are reported as skipped points, never an error.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opscope.engine.bench.measure.options import BenchOptions, SuitePlan
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Extra, Point, skipped_point
from opscope.engine.bench.suites import _model as M
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError

log = logging.getLogger(__name__)

NAME = "peers"
DESCRIPTION = "OpScope vs llama.cpp and HF transformers on the same GGUF, interleaved: pp512, tg128, load"
REFERENCE = "opscope"


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
    peers: tuple[str, ...] = param(
        (
            "opscope",
            "llama_bench",
            "hf_fp32",
            "hf_bf16",
            "opscope:prefill_dtype=bf16",
            "opscope:activations=q8",
            "opscope:weights=dense",
            "opscope:fused_decode=0",
        ),
        "Peers",
        "",
        "Engines compared on the same GGUF, interleaved: opscope, llama_bench, hf_fp32, "
        "hf_bf16, or opscope:KEY=VALUE for a fast-path variant.",
    )
    load_peers: tuple[str, ...] = param(
        ("opscope", "llama_cpp"),
        "Load-time peers",
        "",
        "Engines whose model load time is measured with a fresh load each round "
        "(slow: keep the list short; empty skips it).",
    )
    llama_bench: str = param(
        "",
        "Path of llama-bench",
        "",
        "Path of the llama-bench executable; empty: $OPSCOPE_LLAMA_BENCH, else llama-bench on PATH.",
    )


QUICK = Params(pp=64, tg=16, peers=("opscope", "llama_bench", "opscope:weights=dense"), load_peers=())


def _sec(t0_ns: int) -> float:
    return (now_ns() - t0_ns) / 1e9


class OpScopePeer:
    """The engine with its CPU fast path (engine.fastpath.load) under the given settings."""

    def __init__(self, name: str, path: Path, threads: int):
        from opscope.engine.fastpath import FastPathOptions

        self.name, self.path, self.threads = name, path, threads
        self.options = FastPathOptions.from_string(name.partition(":")[2])
        self.lm: Any = None  # a LoadedModel once load() ran (the fast path's or the plain one)

    @property
    def loaded(self) -> bool:
        return self.lm is not None

    def load(self) -> float:
        from opscope.engine.fastpath import load

        self.lm = None
        gc.collect()
        t0 = now_ns()
        lm = load(str(self.path), self.options, threads=self.threads)
        seconds = _sec(t0)
        self.lm = lm
        return seconds

    def pp(self, toks) -> float:
        import torch

        self.lm.model.setup_cache(1, toks.shape[1])
        t0 = now_ns()
        with torch.inference_mode():
            self.lm.model(toks, 0, last_only=True)
        return _sec(t0)

    def tg(self, toks) -> float:
        import torch

        model = self.lm.model
        model.setup_cache(1, toks.shape[1])
        t0 = now_ns()
        with torch.inference_mode():
            for i in range(toks.shape[1]):
                model(toks[:, i : i + 1], i, last_only=True)
        return _sec(t0)


class LlamaCppPeer:
    """llama.cpp through llama-cpp-python, the same file and thread count."""

    def __init__(self, name: str, path: Path, threads: int, n_ctx: int, n_batch: int):
        import llama_cpp  # noqa: F401  (ImportError: the peer is skipped)

        self.name, self.path, self.threads, self.n_ctx, self.n_batch = name, path, threads, n_ctx, n_batch
        self.llm: Any = None  # llama_cpp.Llama (untyped library) once load() ran

    @property
    def loaded(self) -> bool:
        return self.llm is not None

    def load(self) -> float:
        from llama_cpp import Llama

        self.llm = None
        gc.collect()
        t0 = now_ns()
        self.llm = Llama(
            model_path=str(self.path),
            n_threads=self.threads,
            n_threads_batch=self.threads,
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_ubatch=self.n_batch,
            verbose=False,
        )
        return _sec(t0)

    def pp(self, toks) -> float:
        ids = toks[0].tolist()
        self.llm.reset()  # the next eval drops the KV cache from position 0 on
        t0 = now_ns()
        self.llm.eval(ids)
        return _sec(t0)

    def tg(self, toks) -> float:
        ids = toks[0].tolist()
        self.llm.reset()  # the next eval drops the KV cache from position 0 on
        t0 = now_ns()
        for t in ids:
            self.llm.eval([t])
        return _sec(t0)


class LlamaBenchPeer:
    """llama.cpp's own llama-bench binary: one child process per round and test (engine.bench.llama_bench)."""

    loaded = True  # every round loads the model in its own process; load time is not measured
    measures_load = False

    def __init__(self, name: str, path: Path, threads: int, binary: Path):
        from opscope.engine.bench.peers import llama_bench

        self.name, self.path, self.threads, self.binary = name, path, threads, binary
        self.version = llama_bench.check_binary(binary)

    def load(self) -> float:
        return 0.0

    def _run(self, n_prompt: int, n_gen: int) -> float:
        from opscope.engine.bench.peers import llama_bench

        result = llama_bench.run(self.binary, self.path, n_prompt, n_gen, self.threads)
        seconds = result.pp_s if n_prompt else result.tg_s
        if not seconds:
            raise RuntimeError(f"llama-bench reported no {'pp' if n_prompt else 'tg'} sample for {self.path.name}")
        return seconds[0]

    def pp(self, toks) -> float:
        return self._run(toks.shape[1], 0)

    def tg(self, toks) -> float:
        return self._run(0, toks.shape[1])


class HFPeer:
    """Hugging Face transformers loading the GGUF itself (dequantized to fp32 or bf16)."""

    def __init__(self, name: str, path: Path, threads: int):
        import transformers  # noqa: F401  (ImportError: the peer is skipped)

        self.name, self.path, self.threads = name, path, threads
        self.dtype_name = "bfloat16" if name.endswith("bf16") else "float32"
        self.model: Any = None  # a transformers model (untyped library) once load() ran

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def load(self) -> float:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = None
        gc.collect()
        t0 = now_ns()
        self.model = AutoModelForCausalLM.from_pretrained(
            str(self.path.parent), gguf_file=self.path.name, dtype=getattr(torch, self.dtype_name)
        ).eval()
        return _sec(t0)

    def pp(self, toks) -> float:
        import torch
        from transformers import DynamicCache

        t0 = now_ns()
        with torch.inference_mode():
            self.model(toks, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        return _sec(t0)

    def tg(self, toks) -> float:
        import torch
        from transformers import DynamicCache

        cache = DynamicCache()
        t0 = now_ns()
        with torch.inference_mode():
            for i in range(toks.shape[1]):
                self.model(toks[:, i : i + 1], past_key_values=cache, use_cache=True, logits_to_keep=1)
        return _sec(t0)


def make_peer(name: str, path: Path, threads: int, p: Params):
    """The peer named ``name``; ImportError when its package is not installed."""
    if name == REFERENCE or name.startswith(REFERENCE + ":"):
        return OpScopePeer(name, path, threads)
    if name == "llama_cpp":
        return LlamaCppPeer(name, path, threads, n_ctx=max(p.pp, p.tg) + 16, n_batch=p.pp)
    if name == "llama_bench":
        from opscope.engine.bench.peers import llama_bench

        binary = llama_bench.find_binary(p.llama_bench or None)  # ConfigError: set but missing
        if binary is None:
            raise ImportError(
                f"no llama-bench: set --param llama_bench=PATH or ${llama_bench.ENV_VAR}, or put llama-bench on PATH",
                name="llama-bench",
            )
        return LlamaBenchPeer(name, path, threads, binary)
    if name in ("hf_fp32", "hf_bf16"):
        return HFPeer(name, path, threads)
    raise ConfigError(f"unknown peer {name!r}: use opscope[:settings], llama_bench, llama_cpp, hf_fp32, hf_bf16")


def _round(peers: list, run, r: list[int]) -> dict[str, float]:
    """Runs ``run(peer)`` for every peer, the order reversed on every other round."""
    order = peers if r[0] % 2 == 0 else peers[::-1]
    r[0] += 1
    return {peer.name: run(peer) for peer in order}


def _throughput_point(test: str, n: int, peers: list, toks) -> Point:
    counter = [0]

    def prepare():
        return lambda: _round(peers, lambda peer: getattr(peer, test)(toks), counter)

    def observe(seconds: dict[str, float]) -> dict[str, float]:
        tok_s = {name: n / s for name, s in seconds.items()}
        out = {f"{test}{n}.{name}": v for name, v in tok_s.items()}
        ref = tok_s.get(REFERENCE)
        if ref is not None:
            out |= {f"{test}{n}.ratio.{name}": ref / v for name, v in tok_s.items() if name != REFERENCE}
        return out

    extras = tuple(Extra(f"{test}{n}.{pr.name}", "tok/s", True) for pr in peers) + tuple(
        Extra(f"{test}{n}.ratio.{pr.name}", "x", True) for pr in peers if pr.name != REFERENCE
    )
    return Point(
        f"{test}{n}.round",
        "s",
        prepare,
        value=float,
        higher_is_better=False,
        params={"n": n, "peers": [pr.name for pr in peers]},
        observe=observe,
        extras=extras,
    )


def _load_point(peers: list) -> Point:
    counter = [0]

    def observe(seconds: dict[str, float]) -> dict[str, float]:
        out = {f"load.{name}": s * 1e3 for name, s in seconds.items()}
        ref = seconds.get(REFERENCE)
        if ref is not None:
            out |= {f"load.ratio.{name}": s / ref for name, s in seconds.items() if name != REFERENCE}
        return out

    extras = tuple(Extra(f"load.{pr.name}", "ms") for pr in peers) + tuple(
        Extra(f"load.ratio.{pr.name}", "x", True) for pr in peers if pr.name != REFERENCE
    )
    return Point(
        "load.round",
        "s",
        lambda: lambda: _round(peers, lambda pr: pr.load(), counter),
        value=float,
        higher_is_better=False,
        params={"peers": [pr.name for pr in peers]},
        observe=observe,
        extras=extras,
    )


def _model_path(opts: BenchOptions) -> Path:
    from opscope.engine.core.defaults import default_model_path

    path = Path(opts.model) if opts.model else default_model_path()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise ConfigError(f"the peers suite compares engines on one GGUF file; {path} is not one")
    if opts.device != "cpu":
        raise ConfigError(f"the peers suite runs on the CPU (llama-cpp-python's CPU build); got --device {opts.device}")
    return path


def _make_peers(path: Path, threads: int, p: Params) -> tuple[list, dict[str, str]]:
    peers, missing = [], {}
    for name in p.peers:
        try:
            peers.append(make_peer(name, path, threads, p))
        except ImportError as e:
            missing[name] = (
                str(e) if name == "llama_bench" else f"not installed ({e.name or e}); pip install -e '.[peers]'"
            )
    if not peers or peers[0].name != REFERENCE:
        raise ConfigError(f"the peers list must start with {REFERENCE!r}, got {list(p.peers)}")
    return peers, missing


def _points(peers: list, missing: dict[str, str], p: Params, vocab: int):
    for name, reason in missing.items():
        yield skipped_point(f"peer.{name}", "tok/s", reason)
    loaders = [peer for peer in peers if peer.name in p.load_peers and getattr(peer, "measures_load", True)]
    if loaders:
        yield _load_point(loaders)
    for peer in peers:
        if not peer.loaded:
            peer.load()
    yield _throughput_point("pp", p.pp, peers, M.random_tokens(p.pp, vocab, 2, "cpu"))
    yield _throughput_point("tg", p.tg, peers, M.random_tokens(p.tg, vocab, 3, "cpu"))


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    import torch
    from opscope.engine.formats import open_model

    p = params or (QUICK if opts.quick else Params())
    path = _model_path(opts)
    threads = opts.threads or torch.get_num_threads()
    peers, missing = _make_peers(path, threads, p)
    source = open_model(str(path))
    settings: dict[str, Any] = {
        "pp": p.pp,
        "tg": p.tg,
        "peers": list(p.peers),
        "threads": threads,
        "missing_peers": missing,
        "model_file": str(path),
        "peer_versions": _versions(),
    }
    settings["llama_bench_binaries"] = {
        pr.name: {"binary": str(pr.binary), "version": pr.version} for pr in peers if isinstance(pr, LlamaBenchPeer)
    }
    n_points = (
        len(missing) + 2 + int(any(pr.name in p.load_peers and getattr(pr, "measures_load", True) for pr in peers))
    )
    return SuitePlan(
        points=_points(peers, missing, p, source.config.vocab_size),
        n_points=n_points,
        settings=settings,
        model_source=source,
        close=lambda: peers.clear(),
    )


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("llama_cpp_python", "transformers", "torch"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out
