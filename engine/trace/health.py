"""Training health, read from the same run as the trace: is the loss falling, does every parameter
of the model get a gradient, does the optimizer step the model's parameters, are gradients finite
and non-zero. Each problem is a Finding with the module path and the line.

Where the values come from (all without a host sync inside the loop; read once, at the end):
  loss       the tensor given to ``torch.autograd.backward`` (``loss.backward()`` calls it): a faithful
             wrapper, installed for the run and removed after, keeps a detached copy on its device
  gradients  an optimizer step pre-hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``)
             takes each gradient's norm on its device before the step
  parameters the roots of the script's module tree (engine.trace.modstack "script" mode) versus
             the optimizer's param_groups
Bookkeeping ops run with the tracer suspended, so the trace shows only the script's own ops.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

import torch
from opscope.engine.trace.findings import Finding
from opscope.engine.trace.source import caller_site, format_site

log = logging.getLogger(__name__)

LOSS, NO_GRAD, OPTIMIZER, GRADIENT = "loss", "no_grad", "optimizer", "gradient"
HEALTH_KINDS = (LOSS, NO_GRAD, OPTIMIZER, GRADIENT)
_MAX_RECORDS = 100_000  # losses and gradient-norm steps kept; a longer run keeps its first ones


@dataclass(frozen=True)
class HealthOptions:
    """``min_steps``: losses needed before "not falling" is judged. The loss falls when the median of
    its last third is below the median of its first third by more than ``min_drop`` (relative)."""

    min_steps: int = 6
    min_drop: float = 0.01


@dataclass
class _OptRecord:
    site: str | None
    params: list = field(default_factory=list)  # the params whose grad norms were taken, per step
    steps: int = 0
    empty_steps: int = 0  # steps where none of its parameters had a gradient
    norms: list = field(default_factory=list)  # one device tensor of norms per step


class HealthMonitor:
    """Installed around a script's run by engine.trace.script; ``findings()`` after it ends."""

    def __init__(self, tracer, modules, options: HealthOptions | None = None):
        self.tracer, self.modules = tracer, modules  # Tracer, ModuleStack in "script" mode
        self.options = options or HealthOptions()
        self.losses: list = []  # detached 0-dim copies, on their device
        self.loss_site: str | None = None
        self.optimizers: dict[int, _OptRecord] = {}
        self._opt_refs: dict[int, torch.optim.Optimizer] = {}
        self._got_grad: set[int] = set()
        self._original_backward = None
        self._handles: list = []

    # -- install ---------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        original = self._original_backward = torch.autograd.backward
        monitor = self

        @functools.wraps(original)  # same name, docstring and __wrapped__
        def backward(tensors, *args, **kwargs):  # same signature: every argument passed through
            monitor._on_backward(tensors)
            return original(tensors, *args, **kwargs)

        torch.autograd.backward = backward
        self._handles.append(register_optimizer_step_pre_hook(self._on_optimizer_step))

    def remove(self) -> None:
        if self._original_backward is not None:
            torch.autograd.backward = self._original_backward
            self._original_backward = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        with self.tracer.suspended():
            self._note_grads(self._model_params())

    def _on_backward(self, tensors) -> None:
        t = tensors if isinstance(tensors, torch.Tensor) else next(iter(tensors), None)
        if not isinstance(t, torch.Tensor) or t.numel() != 1 or len(self.losses) >= _MAX_RECORDS:
            return
        if t.is_meta:  # a dry run on the meta device: no values, so no loss or gradient to judge
            return
        if self.loss_site is None:
            self.loss_site = format_site(caller_site(2))
        with self.tracer.suspended():
            self.losses.append(t.detach().reshape(()).to(torch.float32, copy=True))

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        rec = self.optimizers.get(id(optimizer))
        if rec is None:
            rec = self.optimizers[id(optimizer)] = _OptRecord(format_site(caller_site(2)))
            self._opt_refs[id(optimizer)] = optimizer
        with self.tracer.suspended():
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            rec.steps += 1
            rec.empty_steps += not params
            self._note_grads(params)
            if params and len(rec.norms) < _MAX_RECORDS:
                rec.params.append(params)
                rec.norms.append(_norms([p.grad for p in params]))

    def _note_grads(self, params) -> None:
        self._got_grad.update(id(p) for p in params if p.grad is not None)

    # -- judge -----------------------------------------------------------------------------------
    def _model_params(self) -> list:
        return [p for root in self.modules.roots.values() for p in root.parameters()]

    def findings(self) -> list[Finding]:
        with self.tracer.suspended():
            losses = torch.stack(self.losses).cpu().tolist() if self.losses else []
            found = self._loss_findings(losses)
            if self.losses:  # the gradient checks need a backward pass to judge
                found += self._grad_findings() + self._optimizer_findings()
        return found

    def loss_values(self) -> list[float]:
        with self.tracer.suspended():
            return torch.stack(self.losses).cpu().tolist() if self.losses else []

    def _loss_findings(self, losses: list[float]) -> list[Finding]:
        where = self.loss_site or "?"
        bad = [i for i, v in enumerate(losses) if v != v or v in (float("inf"), float("-inf"))]
        if bad:
            return [
                Finding(
                    LOSS,
                    "high",
                    f"the loss passed to backward() at {where} is not finite from "
                    f"step {bad[0]} on ({len(bad)} of {len(losses)} steps)",
                    ("",),
                    _sites(where),
                    {"lines": [f"{where}: loss {_series(losses)}"]},
                    "lower the learning rate, check the inputs for NaN/inf, or clip gradients",
                )
            ]
        n = len(losses)
        if n < self.options.min_steps:
            return []
        third = max(n // 3, 1)
        first, last = statistics.median(losses[:third]), statistics.median(losses[-third:])
        if last < first - self.options.min_drop * max(abs(first), 1e-12):
            return []
        return [
            Finding(
                LOSS,
                "high",
                f"the loss passed to backward() at {where} does not fall: median "
                f"{first:.4g} over the first {third} steps, {last:.4g} over the last {third}",
                ("",),
                _sites(where),
                {"lines": [f"{where}: loss {_series(losses)}"], "loss_first": first, "loss_last": last, "steps": n},
                "check that the optimizer steps the model's parameters, that no gradient is cut "
                "(detach, no_grad, .item() inside the graph), and the learning rate",
            )
        ]

    def _named(self) -> dict[int, tuple[str, str | None]]:
        """id(param) → (module path, the line that first called the module)."""
        out: dict[int, tuple[str, str | None]] = {}
        for root_name, root in self.modules.roots.items():
            for path, module in root.named_modules():
                name = f"{root_name}.{path}" if path else root_name
                site = self.modules.call_sites.get(name)
                for pname, p in module.named_parameters(recurse=False):
                    out.setdefault(id(p), (f"{name}.{pname}", site))
        return out

    def _grad_findings(self) -> list[Finding]:
        named, found = self._named(), []
        for root in self.modules.roots.values():
            params = [p for p in root.parameters() if p.requires_grad]
            missing = [p for p in params if id(p) not in self._got_grad]
            if missing and len(missing) < len(params):  # a root with no gradient at all is frozen on purpose
                found.append(
                    _param_finding(
                        NO_GRAD,
                        missing,
                        named,
                        "never received a gradient",
                        "the module's output is cut from the loss (detach(), .item(), "
                        "torch.no_grad, or an unused branch); reconnect it or freeze it "
                        "with requires_grad_(False)",
                    )
                )
        zero, nonfinite = self._grad_norm_flags()
        if nonfinite:
            found.append(
                _param_finding(
                    GRADIENT,
                    nonfinite,
                    named,
                    "got non-finite gradients first",
                    "find the op that overflows (log of 0, division, fp16 range); "
                    "lower the learning rate or clip gradients",
                )
            )
        if zero:
            found.append(
                _param_finding(
                    GRADIENT,
                    zero,
                    named,
                    "got gradients that are all zero at every step",
                    "the path from these parameters to the loss is flat (a dead ReLU, "
                    "a zero mask, a constant output); check the module's inputs",
                )
            )
        return found

    def _grad_norm_flags(self) -> tuple[list, list]:
        """(params whose gradient was zero at every step, params whose gradient went non-finite at the
        first step any did: later ones mostly follow from it, once the optimizer spread the NaN)."""
        seen: Counter = Counter()
        zero_steps: Counter = Counter()
        first_bad: dict[int, int] = {}
        params_by_id: dict[int, object] = {}
        for rec in self.optimizers.values():
            for step, (params, norms) in enumerate(zip(rec.params, rec.norms)):
                for p, v in zip(params, norms.cpu().tolist()):
                    params_by_id[id(p)] = p
                    seen[id(p)] += 1
                    zero_steps[id(p)] += v == 0.0
                    if not math.isfinite(v):
                        first_bad.setdefault(id(p), step)
        zero = [params_by_id[i] for i, n in seen.items() if zero_steps[i] == n and i not in first_bad]
        earliest = min(first_bad.values(), default=None)
        bad = [params_by_id[i] for i, s in first_bad.items() if s == earliest]
        return zero, bad

    def _optimizer_findings(self) -> list[Finding]:
        model = {id(p) for p in self._model_params() if p.requires_grad}
        found = []
        for key, rec in self.optimizers.items():
            opt = self._opt_refs[key]
            stepped = [p for g in opt.param_groups for p in g["params"]]
            if rec.empty_steps and self.losses:
                found.append(
                    Finding(
                        GRADIENT,
                        "high",
                        f"{type(opt).__name__}.step() at {rec.site or '?'} found no gradient on any of "
                        f"its {len(stepped)} parameter tensor(s) in {rec.empty_steps} of {rec.steps} steps, although "
                        f"backward() ran at {self.loss_site or '?'}: those steps change nothing",
                        tuple(self.modules.roots),
                        _sites(rec.site),
                        {"lines": [f"{rec.site or '?'}: optimizer.step() with no gradients ({rec.empty_steps}×)"]},
                        "call optimizer.zero_grad() before backward() (or right after step()), never between "
                        "backward() and step()",
                    )
                )
            if not stepped or any(id(p) in model for p in stepped):
                continue
            roots = ", ".join(self.modules.roots) or "no module"
            found.append(
                Finding(
                    OPTIMIZER,
                    "high",
                    f"{type(opt).__name__} stepped at {rec.site or '?'} updates {len(stepped)} "
                    f"parameter tensor(s), none of them the model's ({roots}): the model never changes",
                    tuple(self.modules.roots),
                    _sites(rec.site),
                    {"lines": [f"{rec.site or '?'}: optimizer.step()"]},
                    "build the optimizer from the parameters of the model you train, after the model is created "
                    "and moved (optimizer = Opt(model.parameters()) after model.to(device))",
                )
            )
        return found


def _norms(grads: list) -> torch.Tensor:
    """The 2-norm of each gradient, on their device, as one tensor (float32)."""
    try:
        norms = torch._foreach_norm(grads)  # one fused kernel per device and dtype, as clip_grad_norm_ does
    except (RuntimeError, AttributeError):
        norms = [torch.linalg.vector_norm(g) for g in grads]
    return torch.stack([n.to(grads[0].device, torch.float32) for n in norms])


def _param_finding(kind: str, params: list, named: dict, what: str, fix: str) -> Finding:
    places = [named.get(id(p), (f"(unnamed parameter {tuple(p.shape)})", None)) for p in params]
    modules = tuple(dict.fromkeys(path.rsplit(".", 1)[0] for path, _ in places))
    sites = tuple(dict.fromkeys(s for _, s in places if s))
    names = ", ".join(path for path, _ in places[:4]) + (f" and {len(places) - 4} more" if len(places) > 4 else "")
    where = f" (called at {', '.join(sites[:2])})" if sites else " (the module never ran in a forward)"
    lines = [f"{s or '?'}: {path}" for path, s in places[:6]]
    evidence = {"lines": lines, "parameters": len(params)}
    return Finding(kind, "high", f"{names} {what}{where}", modules, sites, evidence, fix)


def _sites(site: str | None) -> tuple[str, ...]:
    return (site,) if site else ()


def _series(values: list[float], n: int = 6) -> str:
    """[a, b, c, …, x, y, z] over N steps: the first and last few values."""

    def text(vs: list[float]) -> str:
        return ", ".join(f"{v:.4g}" for v in vs)

    if len(values) <= n:
        return f"[{text(values)}]"
    return f"[{text(values[: n // 2])}, …, {text(values[-(n // 2) :])}] over {len(values)} steps"
