"""`opscope generate`, `opscope chat`, `opscope models inspect`."""

from __future__ import annotations

import argparse
import os
import sys

from opscope.engine.cli.args import Terminated, output_file, utf8_text
from opscope.engine.cli.common import add_model_args, add_sampling_args, generation_config, load_from_args
from opscope.engine.core import json_output
from opscope.engine.core.cpuload import OtherLoad
from opscope.engine.core.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt, streaming")
    p.add_argument("prompt", type=prompt_text, help="the prompt; - reads it from stdin")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_model_args(p)
    add_nproc_arg(p)
    p.add_argument(
        "--trace-out",
        type=output_file,
        default=None,
        metavar="PATH.json",
        dest="trace_out",
        help="with --nproc: write every rank's forwards and all_reduces as a Chrome/Perfetto "
        "trace, one process per rank on one time axis",
    )
    add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive multi-turn chat using the model's chat template")
    p.add_argument("--system", type=utf8_text, default=None, help="system prompt")
    add_model_args(p)
    add_nproc_arg(p)
    add_sampling_args(p, max_tokens=512)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("models", help="inspect model files")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    q = msub.add_parser("inspect", help="architecture, parameters, quantization, tokenizer, template")
    q.add_argument("path", nargs="?", default=None, help="GGUF file or HF directory (default: embedded model)")
    q.add_argument("--json", action="store_true")
    q.add_argument(
        "--backend",
        default="torch",
        help="also say how this backend takes the file's tensor types (e.g. mlx: converted at load)",
    )
    q.set_defaults(func=cmd_inspect)


def prompt_text(text: str) -> str:
    """The prompt: UTF-8, not empty (an empty prompt tokenizes to nothing, known only after loading)."""
    text = utf8_text(text)
    if text == "":
        raise argparse.ArgumentTypeError("empty: give the prompt's text, or - to read it from stdin")
    return text


prompt_text.__name__ = "prompt"


def add_nproc_arg(p) -> None:
    from opscope.engine.cli import args as check

    p.add_argument(
        "--nproc",
        type=check.int_in(1, 64, what="processes"),
        default=None,
        metavar="N",
        help="run the model tensor-parallel over N processes (torch.distributed: gloo on cpu, "
        "nccl on cuda; N = 1 too, a world of one); N must divide the KV heads; dense "
        "weights, no fast path",
    )


def summary_line(stats, energy_said: set | None = None, other_cores: float | None = None) -> str:
    """The stats line after a reply. The prompt's tokens reused from the KV cache are named (the
    prefill rate is over the others). ``energy_said``: the reasons for "energy N/A" already printed
    in this session (chat), each said once, then "energy N/A" alone. ``other_cores``: the cores other
    processes kept busy during the reply (engine.core.cpuload), named when they disturbed it."""
    cached = f" ({stats.cached_tokens} cached)" if getattr(stats, "cached_tokens", 0) else ""
    return (
        f"prompt {stats.prompt_tokens} tok{cached} · generated {stats.generated_tokens} tok · "
        f"TTFT {stats.ttft_ms:.0f} ms · prefill {stats.prefill_tok_s:.1f} tok/s · "
        f"decode {stats.decode_tok_s:.1f} tok/s · {_energy_text(stats, energy_said)}{_disturbed_text(other_cores)}"
    )


def _disturbed_text(other_cores: float | None) -> str:
    """Where other processes held the CPU during the reply (the benchmarks' threshold), the timings
    are the host's, not the model's: say so on the line that shows them."""
    from opscope.engine.bench.measure.quality import DISTURBED_CORES

    if other_cores is None or other_cores < DISTURBED_CORES:
        return ""
    return f" · disturbed: other processes kept {other_cores:.1f} of {os.cpu_count() or 1} cores busy"


def _energy_text(stats, said: set | None) -> str:
    from opscope.engine.telemetry.energy import stats_text

    text = stats_text(stats)
    if said is None or not text.startswith("energy N/A: "):
        return text
    if text in said:
        return "energy N/A"
    said.add(text)
    return text


def _stream(events, out=None, quiet: bool = False):
    """Writes the reply as it comes, with prompt progress and the decode rate live on stderr where it
    is a terminal (engine.cli.live). The generator is closed whatever happens here (a write fails,
    a Ctrl-C between tokens), so its tensors are freed now, not at the interpreter's teardown
    (docs/decisions/0005-generation-closed-when-streaming-stops.md)."""
    from opscope.engine.cli.live import LiveStatus, isatty
    from opscope.engine.generation.events import Finished, Token

    out = out or sys.stdout  # looked up now: tests and the CLI's output guard replace sys.stdout
    live = LiveStatus(sys.stderr if not quiet else None, isatty(out) and isatty(sys.stderr))
    final = None
    try:
        for ev in events:
            live.before(ev)
            if isinstance(ev, Token) and not quiet:
                out.write(ev.text)
                out.flush()
                live.after(ev, ev.text)
            elif isinstance(ev, Finished):
                final = ev
                live.close()
                if not quiet:
                    out.write(ev.tail)
    finally:
        live.close()
        getattr(events, "close", lambda: None)()  # a plugin's iterator may not be a generator
    return final


def read_stdin_prompt() -> str:
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"the prompt on stdin is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset "
            f"{e.start}): pass the text in UTF-8"
        ) from e
    if text == "":
        raise ConfigError("the prompt on stdin is empty: pipe the prompt's text in")
    return text


def cmd_generate(args) -> int:
    if args.prompt == "-":
        args.prompt = read_stdin_prompt()
    generation_config(args)  # bad sampling flags fail before anything is loaded
    tp = tensor_parallel(args)
    if getattr(args, "trace_out", None) and not tp:
        raise ConfigError("--trace-out is the per-rank trace of --nproc N; for one process's ops use `opscope trace`")
    if tp:
        from opscope.engine.distributed.tp_worker import GENERATE_TIMEOUT_S, job_from_args, run_tp

        return run_tp(job_from_args(args, GENERATE_TIMEOUT_S), generate_with, args)
    return generate_with(load_from_args(args), args)


def generate_with(lm, args) -> int:
    """The body of `opscope generate` on a loaded model (rank 0's, with --nproc)."""
    cfg = generation_config(args)
    events = lm.chat([{"role": "user", "content": args.prompt}], cfg) if args.chat else lm.generate(args.prompt, cfg)
    load = OtherLoad()
    done = _stream(events, quiet=args.json)
    other_cores = load.cores()
    if args.json:
        print(
            json_output.dumps(
                {
                    "text": done.text,
                    "stop_reason": done.stop_reason,
                    **done.stats.as_dict(),
                    **lm.describe(),
                    "other_cores": other_cores,
                }
            )
        )
    else:
        print(f"\n[{done.stop_reason}] {summary_line(done.stats, other_cores=other_cores)}", file=sys.stderr)
    if getattr(lm, "tp", None) is not None:  # --nproc: the ranks' all_reduce share, imbalance, trace
        lm.tp.report(sys.stderr, getattr(args, "trace_out", None))
    return 0


def tensor_parallel(args) -> bool:
    """Whether --nproc was given: then the model runs tensor-parallel through the launcher, one
    rank included (a world of one: the communicator and all_reduces of the path, on a one-GPU
    machine). Without it, one plain process. Leaves ``args.nproc`` an int either way."""
    given = getattr(args, "nproc", None) is not None
    args.nproc = args.nproc if given else 1
    return given


def cmd_chat(args) -> int:
    if tensor_parallel(args):
        from opscope.engine.distributed.tp_worker import CHAT_TIMEOUT_S, job_from_args, run_tp

        return run_tp(job_from_args(args, CHAT_TIMEOUT_S, stdin=True), chat_with, args)
    return chat_with(load_from_args(args), args)


def chat_with(lm, args) -> int:
    """The body of `opscope chat` on a loaded model (rank 0's, with --nproc)."""
    cfg = generation_config(args)
    history = [{"role": "system", "content": args.system}] if args.system else []
    energy_said: set[str] = set()  # why energy is N/A: said after the first reply, not after every one
    print(
        f"opscope chat · {lm.source.path.name} on {lm.device} ({str(lm.dtype).removeprefix('torch.')}) · "
        f"empty line or Ctrl-D to quit, /reset to clear",
        file=sys.stderr,
    )
    while True:
        try:
            line = _prompt("\n> ").strip()
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"chat input is not valid UTF-8 (byte 0x{e.object[e.start]:02x}): type or pipe text in UTF-8"
            ) from e
        except EOFError:  # Ctrl-D: the normal way out
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:  # Ctrl-C at the prompt ends the chat (exit 130; with --nproc on every rank)
            _end_prompt_line()
            raise
        if not line:
            return 0
        if line == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": line})
        try:
            load = OtherLoad()
            done = _stream(lm.chat(history, cfg))
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated):
                raise  # (--nproc: rank 0 raises Ctrl-C only between forwards, so every rank can go on)
            print("\n[stopped]", file=sys.stderr)
            history.pop()
            continue
        history.append({"role": "assistant", "content": done.text})
        print(f"\n[{done.stop_reason}] {summary_line(done.stats, energy_said, load.cores())}", file=sys.stderr)


def _prompt(text: str) -> str:
    """input(text). Not at a terminal (piped input: a script, a test) the prompt is written first
    from Python: a Ctrl-C arriving just after it is raised at the next bytecode, whereas inside
    input() one that lands between its write and its read() is only noticed when a line comes."""
    if sys.stdin.isatty():
        return input(text)  # readline takes Ctrl-C itself and needs the prompt to redraw the line
    sys.stdout.write(text)
    sys.stdout.flush()
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's StringIO): nothing can block
        return input()
    return _read_line(fd)


_pending = bytearray()  # what _read_line read past the last line it returned


def _read_line(fd: int) -> str:
    """One line of piped input, read in short waits. A blocking read() would not return for a Ctrl-C
    that another thread of the process received (torch's and the kernels' threads do not block it)
    or that landed just before the read: each wait returns to Python, which raises it."""
    import select

    while b"\n" not in _pending:
        if not select.select([fd], [], [], 0.1)[0]:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # end of input
            if not _pending:
                raise EOFError
            break
        _pending.extend(chunk)
    end = _pending.find(b"\n")
    end = len(_pending) if end < 0 else end + 1
    line = bytes(_pending[:end])
    del _pending[:end]
    return line.decode("utf-8").removesuffix("\n")


def _end_prompt_line() -> None:
    """After ``> ^C`` the cursor is still on the prompt's line (stdout): end it there, so the one line
    on stderr starts a line of its own."""
    try:
        sys.stdout.write("\n")
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):  # stdout closed or absent: the line on stderr is what counts
        pass


def _conversion(backend_name: str, info: dict) -> str:
    """How a plugin backend takes the file's types (its optional ``conversion(types)`` hook)."""
    from opscope.engine.backends import get_backend

    hook = getattr(get_backend(backend_name), "conversion", None)
    if hook is None or info.get("format") != "gguf":
        return f"the {backend_name} backend reads the tensors as stored"
    return "; ".join(hook(info.get("quantization") or {})) or "none: float tensors stay dense"


def cmd_inspect(args) -> int:
    from opscope.engine.formats.inspect import format_text, inspect_path

    info = inspect_path(args.path)  # any GGUF's metadata, and in one line why it cannot run, if so
    if info.get("format") == "gguf" and info.get("runnable") == "yes":
        info = _with_metadata_last(info, cpu_kernels=_cpu_kernels())
    if args.backend != "torch":
        info = {**info, f"{args.backend}_conversion": _conversion(args.backend, info)}
    print(json_output.dumps(info, indent=2, default=str) if args.json else format_text(info))
    return 0


def _cpu_kernels() -> str:
    """The kernel variant the CPU fast path would run here and why (nothing loaded or compiled)."""
    from opscope.engine.core.errors import EngineError
    from opscope.engine.fastpath.kernels import build, variants

    try:
        return variants.reason(build.variant())
    except EngineError as e:
        return f"none: {e}"


def _with_metadata_last(info: dict, **extra) -> dict:
    """``info`` with ``extra`` added before its metadata block (which format_text prints last)."""
    meta = {k: v for k, v in info.items() if k == "metadata"}
    return {**{k: v for k, v in info.items() if k != "metadata"}, **extra, **meta}
