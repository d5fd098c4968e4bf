"""`opscope plugins list|enable|disable`: see and manage backend plugins."""

from __future__ import annotations

import argparse

from opscope.engine.backends.registry import DISABLED, PluginInfo, default_registry
from opscope.engine.backends.settings import disabled_plugins, set_enabled
from opscope.engine.core import json_output
from opscope.engine.core.errors import BackendError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plugins",
        help="list, enable and disable backend plugins",
        description="Backend plugins declared in the 'opscope.backends' entry-point group.",
    )
    sub = p.add_subparsers(dest="plugins_command", metavar="{list,enable,disable}")
    sub.required = True
    ls = sub.add_parser("list", help="each plugin with its version, status, devices and errors")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.add_argument(
        "--no-load", action="store_true", help="read entry-point metadata only; import no plugin (devices unknown)"
    )
    ls.set_defaults(func=cmd_list)
    for verb in ("enable", "disable"):
        q = sub.add_parser(verb, help=f"{verb} a plugin (persisted in the user settings)")
        q.add_argument("name", help="the plugin's name, as `opscope plugins list` shows it")
        q.set_defaults(func=cmd_enable if verb == "enable" else cmd_disable)


def cmd_list(args: argparse.Namespace) -> int:
    infos = default_registry().infos(load=not args.no_load)
    if args.json:
        print(json_output.dumps([i.as_dict() for i in infos], indent=2))
    elif not infos:
        print("no backend plugins installed (entry-point group 'opscope.backends')")
    else:
        for info in infos:
            print("\n".join(format_info(info)))
    return 0


def format_info(info: PluginInfo) -> list[str]:
    version = f"{info.dist_name} {info.dist_version}" if info.dist_name else "unknown distribution"
    lines = [f"{info.name:<10} {info.status:<12} {version}  ({info.target})"]
    if info.error:
        lines.append(f"    error: {info.error}")
    if info.reason:
        lines.append(f"    unavailable: {info.reason}")
    for d in info.devices:
        state = "available" if d.available else f"unavailable: {d.reason}"
        desc = f" {d.description}" if d.description else ""
        lines.append(f"    device {d.name:<8} {d.kind:<6}{desc} — {state}")
    return lines


def cmd_enable(args: argparse.Namespace) -> int:
    return _set(args.name, True)


def cmd_disable(args: argparse.Namespace) -> int:
    return _set(args.name, False)


def _set(name: str, enabled: bool) -> int:
    registry = default_registry()
    known = registry.names()
    # Enabling a name that is no longer installed still cleans it out of the settings.
    if name not in known and not (enabled and name in disabled_plugins(registry.settings_file)):
        raise BackendError(f"no backend plugin named {name!r} (installed: {', '.join(known) or 'none'})")
    set_enabled(name, enabled, registry.settings_file)
    registry.refresh()
    state = "enabled" if enabled else DISABLED
    print(f"plugin {name!r} {state}")
    return 0
