"""Which nn.Module is running: a stack of module paths kept by forward pre/post hooks.

Two ways to hook (TraceOptions.hooks, compared in benchmarks/trace_overhead.py):
  "model"   hooks on every submodule of the traced model; paths are exact ("layers.3.attn.q_proj").
  "global"  torch's process-wide module hooks; also sees modules outside the traced model (named by
            class), but fires for every module call in the process, other threads included.
  "script"  process-wide hooks for a user's script, whose models are not known up front: a module
            first called outside any other becomes a root named by its class ("TinyNet"), and its
            submodules are named under it ("TinyNet.layers.0.fc"); the line that first called each
            module is kept (``call_sites``) for findings about it.
Post hooks are registered with ``always_call=True`` so an exception inside a forward still pops.
"""

from __future__ import annotations

import logging

from opscope.engine.core.errors import ConfigError

log = logging.getLogger(__name__)

ROOT = "(root)"  # the traced model itself; "" means outside any module


class ModuleStack:
    def __init__(self, model=None, hooks: str = "model"):
        if hooks not in ("model", "global", "script"):
            raise ConfigError(f"unknown module hook mode {hooks!r}: expected 'model', 'global' or 'script'")
        self.model, self.hooks = model, hooks
        self.stack: list[str] = []
        self._handles: list = []
        self._names: dict = {}
        self.roots: dict[str, object] = {}  # "script" mode: root name → module
        self.call_sites: dict[str, str | None] = {}  # "script" mode: module path → first caller file:line

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""

    def install(self) -> None:
        if self.model is not None:
            self._names = {m: (name or ROOT) for name, m in self.model.named_modules()}
        if self.hooks == "global":
            self._install_global()
        elif self.hooks == "script":
            self._install_script()
        elif self.model is not None:
            self._install_per_module()

    def _install_global(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        names, push, pop = self._names, self.stack.append, self._pop

        def pre(module, args):
            push(names.get(module) or type(module).__name__)

        self._handles = [
            register_module_forward_pre_hook(pre),
            register_module_forward_hook(lambda m, a, o: pop(), always_call=True),
        ]

    def _install_script(self) -> None:
        from opscope.engine.trace.source import caller_site, format_site
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        names, sites, push = self._names, self.call_sites, self.stack.append

        def pre(module, args):
            name = names.get(module)
            if name is None:
                name = self._discover(module)
            if name not in sites:
                sites[name] = format_site(caller_site(2))
            push(name)

        self._handles = [
            register_module_forward_pre_hook(pre),
            register_module_forward_hook(lambda m, a, o: self._pop(), always_call=True),
        ]

    def _discover(self, module) -> str:
        """Name a module seen for the first time, and its submodules with it."""
        base = type(module).__name__
        if self.stack:
            base = f"{self.stack[-1]}.{base}"
        else:
            n = sum(1 for r in self.roots if r == base or r.startswith(base + "#"))
            base = base if n == 0 else f"{base}#{n + 1}"
            self.roots[base] = module
        for path, sub in module.named_modules():
            self._names.setdefault(sub, f"{base}.{path}" if path else base)
        return self._names[module]

    def _install_per_module(self) -> None:
        push = self.stack.append
        for module, name in self._names.items():
            self._handles.append(module.register_forward_pre_hook(lambda m, a, _n=name: push(_n)))
            self._handles.append(module.register_forward_hook(self._pop_hook, always_call=True))

    def _pop_hook(self, module, args, output) -> None:
        self._pop()

    def _pop(self) -> None:
        if self.stack:
            self.stack.pop()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.stack:
            log.debug("module stack not empty after tracing: %s", self.stack)
            self.stack.clear()
