"""What each benchmark parameter is called in the Benchmarks panel: a label, its unit and a tooltip.

Suites declare plain dataclass fields (engine/bench/suites/*.py) whose names are for the command
line (``--param call_budget_s=0.5``); the words a person reads live here, in one table keyed by
field name, with a per-suite entry where one name means different things in different suites
(``sizes_bytes`` is a copy in bandwidth, a message in collectives). tests/app/test_app_bench_params.py
fails when a suite gains a field this table does not describe.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParamDoc:
    label: str  # "Call budget"
    unit: str  # "s"; "" for a plain number, a name list or a switch
    help: str  # the tooltip: what the parameter changes in the run

    @property
    def text(self) -> str:
        """The form's label: "Call budget (s)"."""
        return f"{self.label} ({self.unit})" if self.unit else self.label


_D = ParamDoc
PARAMS: dict[str, ParamDoc] = {
    # llm and peers: llama-bench's tests
    "pp": _D("Prompt length", "tokens", "Prompt processing (prefill) test: tokens in one forward pass (llama-bench -p)."),
    "tg": _D("Generation length", "tokens", "Text generation (decode) test: tokens generated one at a time "
                                           "(llama-bench -n)."),
    "depths": _D("Context depths", "tokens", "Tokens already in the KV cache before the pp and tg tests, one "
                                             "run per depth (llama-bench -d); 0 is an empty cache."),
    "gen_prompt": _D("Latency test prompt", "tokens", "Prompt of the end-to-end generation that measures TTFT, "
                                                 "TPOT and inter-token latency."),
    "gen_tokens": _D("Latency test length", "tokens", "Tokens generated in the end-to-end TTFT/TPOT/ITL measurement."),
    "peers": _D("Peers", "", "Engines compared on the same GGUF, interleaved: opscope, llama_bench, hf_fp32, "
                             "hf_bf16, or opscope:KEY=VALUE for a fast-path variant."),
    "load_peers": _D("Load-time peers", "", "Engines whose model load time is measured with a fresh load each "
                                            "round (slow: keep the list short; empty skips it)."),
    "llama_bench": _D("Path of llama-bench", "", "Path of the llama-bench executable; empty: $OPSCOPE_LLAMA_BENCH, "
                                              "else llama-bench on PATH."),
    # matmul
    "dtypes": _D("Data types", "", "Element types measured, each at every size (float32, bfloat16, float16)."),
    "sizes": _D("Matrix sizes", "n×n", "Square matrix sizes n: each point multiplies two n×n matrices "
                                       "(2·n³ FLOP)."),
    "call_budget_s": _D("Call budget", "s", "Skip a size whose single call is predicted (from the smaller sizes) "
                                            "to take longer than this."),
    "planted_slowdown": _D("Planted slowdown", "×", "A deliberate regression to check comparisons end to end: "
                                                    "1 = off, 2 halves the reported rate, 1.1 is 10 % slower."),
    # attention, kv-cache
    "seq_lens": _D("Sequence lengths", "tokens", "Sequence lengths measured, one point each."),
    "batch": _D("Batch size", "sequences", "Sequences processed together in each call."),
    "heads": _D("Attention heads", "", "Query heads of the attention call."),
    "head_dim": _D("Head size", "elements", "Elements per attention head."),
    # bandwidth
    "sizes_bytes": _D("Copy sizes", "bytes", "Bytes copied per point (the rate counts read + write); sizes "
                                             "larger than the caches measure memory."),
    # batch
    "batches": _D("Batch sizes", "sequences", "Sequences decoded together, one point each: throughput against "
                                             "per-sequence latency."),
    "prompt": _D("Prompt length", "tokens", "Tokens in the KV cache of every sequence before decoding starts."),
    "steps": _D("Decode steps", "tokens", "Tokens decoded per sequence in each timed repetition."),
    # collectives
    "collectives": _D("Collectives", "", "Operations measured: all_reduce, all_gather, reduce_scatter, "
                                         "broadcast, all_to_all, send_recv."),
    "reps": _D("Repetitions", "", "Timed repetitions per size (nccl-tests -n)."),
    "nproc": _D("Ranks", "processes", "Processes started on this machine, one rank each (the command line's "
                                      "--nproc); at least 2."),
    # crossover
    "matmul": _D("Matmul sizes", "n×n", "Square matmul sizes timed on the CPU and the GPU, transfers included."),
    "attention": _D("Attention lengths", "tokens", "Sequence lengths of the attention call timed on both devices."),
    "decode": _D("Decode widths", "hidden size", "Hidden sizes of one decode step timed on both devices."),
    "accelerator": _D("Accelerator", "", "Device compared with the CPU (cuda, cuda:1, mps); empty: the first "
                                         "one present."),
    # scaling
    "models": _D("Model shapes", "", "GPT-2-shaped models measured (gpt2-small … gpt2-xl), random weights."),
    "seq": _D("Sequence length", "tokens", "Tokens per sequence in each forward pass."),
    # train-step
    "dim": _D("Model width", "elements", "Hidden size of the small Llama-shaped model trained."),
    "n_layers": _D("Layers", "", "Transformer blocks of the trained model."),
    "n_heads": _D("Attention heads", "", "Query heads per layer."),
    "n_kv_heads": _D("KV heads", "", "Key/value heads per layer (fewer than the query heads: grouped-query "
                                          "attention)."),
    "hidden_dim": _D("MLP width", "elements", "Hidden size of the feed-forward block."),
    "vocab_size": _D("Vocabulary size", "tokens", "Tokens in the model's vocabulary (the size of the output layer)."),
    "lr": _D("Learning rate", "", "AdamW's learning rate; the run checks that the loss decreases."),
    "variants": _D("Variants", "", "Training setups measured, as JSON: autocast dtype, activation "
                                   "checkpointing, gradient accumulation."),
}
SUITE_PARAMS: dict[tuple[str, str], ParamDoc] = {
    ("collectives", "sizes_bytes"): _D("Message sizes", "bytes", "Bytes each collective moves per call "
                                                                "(nccl-tests -b … -e)."),
    ("train-step", "batch"): _D("Batch size", "sequences", "Sequences per optimizer step."),
    ("scaling", "batch"): _D("Batch size", "sequences", "Sequences per forward pass."),
}


def param_doc(suite: str, name: str) -> ParamDoc:
    """How the panel names parameter ``name`` of ``suite``. A field missing from the table (a new
    suite parameter) still gets a readable label from its name; the test names the missing entry."""
    doc = SUITE_PARAMS.get((suite, name)) or PARAMS.get(name)
    if doc is not None:
        return doc
    return ParamDoc(name.replace("_", " ").capitalize(), "", f"--param {name}=…")



_BINARY = (("GiB", 30), ("MiB", 20), ("KiB", 10))


def format_size(n: int) -> str:
    """An exact byte count as a person types it: 67108864 → "64 MiB", 1000 → "1000 B"."""
    for unit, shift in _BINARY:
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """"64 MiB", "64MiB", "1.5 KiB", "4096" or "4096 B" → bytes; ValueError naming the text."""
    t = text.strip().replace(" ", "")
    for unit, shift in _BINARY + (("B", 0),):
        if t.lower().endswith(unit.lower()):
            number = float(t[: -len(unit)])
            if not (number * (1 << shift)).is_integer():
                raise ValueError(f"{text!r} is not a whole number of bytes")
            return int(number * (1 << shift))
    return int(t)
