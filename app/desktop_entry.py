"""Install (or remove) the freedesktop menu entry and icons for the current user (Linux, BSD).

    python -m opscope.app.desktop_entry            # ~/.local/share/applications + hicolor icons
    python -m opscope.app.desktop_entry --uninstall
    python -m opscope.app.desktop_entry --prefix /usr/local/share   # system-wide (run as root)

Reads the files through importlib.resources, so it works from a checkout or an installed wheel.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from opscope import resources

APP_ID = "opscope"


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def targets(prefix: Path) -> dict[Path, bytes]:
    """Every file to write, under ``prefix`` (an XDG data dir), with its content."""
    files = {
        prefix / "applications" / f"{APP_ID}.desktop": resources.read_bytes("opscope.desktop"),
        prefix / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg": resources.read_bytes("opscope.svg"),
    }
    for size in resources.ICON_SIZES:
        files[prefix / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"] = resources.icon_png(size)
    return files


def install(prefix: Path) -> list[Path]:
    written = []
    for path, content in targets(prefix).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        written.append(path)
    _refresh_caches(prefix)
    return written


def uninstall(prefix: Path) -> list[Path]:
    removed = [p for p in targets(prefix) if p.exists()]
    for path in removed:
        path.unlink()
    _refresh_caches(prefix)
    return removed


def _refresh_caches(prefix: Path) -> None:
    # Menus and icon themes cache their contents; both tools are optional.
    for tool, target in (
        ("update-desktop-database", prefix / "applications"),
        ("gtk-update-icon-cache", prefix / "icons" / "hicolor"),
    ):
        if shutil.which(tool) and target.exists():
            subprocess.run(
                [tool, "-q", str(target)] if tool.startswith("gtk") else [tool, str(target)],
                check=False,
                capture_output=True,
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Install the OpScope menu entry and icons.")
    p.add_argument("--prefix", type=Path, default=None, help="XDG data dir (default: $XDG_DATA_HOME or ~/.local/share)")
    p.add_argument("--uninstall", action="store_true")
    args = p.parse_args(argv)
    prefix = args.prefix or data_home()
    paths = uninstall(prefix) if args.uninstall else install(prefix)
    verb = "removed" if args.uninstall else "installed"
    print(f"{verb} {len(paths)} file(s) under {prefix}")  # a command-line tool: printing is its job
    return 0


if __name__ == "__main__":
    sys.exit(main())
