"""Plugin discovery, failure isolation, compatibility checks, settings and the `plugins` CLI.

Fake plugins here are real installed distributions: a ``*.dist-info`` directory with an
``entry_points.txt`` and a module, on a temporary sys.path entry, found by importlib.metadata
exactly as pip-installed plugins are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opscope.engine.backends import API_VERSION, DeviceInfo, Registry, capabilities
from opscope.engine.backends import registry as registry_mod
from opscope.engine.backends.settings import disabled_plugins, set_enabled, settings_path
from opscope.engine.core.errors import BackendError, ConfigError, ModelFormatError

ROOT = Path(__file__).resolve().parents[2]

GOOD = f"""
from opscope.engine.backends import DeviceInfo
class Backend:
    name = "{{name}}"
    api_version = {API_VERSION}
    def is_available(self):
        return True, ""
    def devices(self):
        return [DeviceInfo("cpu", "cpu", True)]
    def load(self, source=None, device="cpu", dtype="float32", **options):
        raise RuntimeError("framework exploded")
    def bench_copy(self, n_bytes, *, device="cpu", iterations=1):
        return [1] * iterations
"""


def make_dist(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """Install a distribution the way pip leaves it: metadata plus top-level modules."""
    info = site / f"{dist.replace('-', '_')}-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.3\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[opscope.backends]\n{lines}\n")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site directory on sys.path holding a broken, an incompatible and a working plugin."""
    site = tmp_path / "site"
    site.mkdir()
    make_dist(
        site,
        "broken-backend",
        {"broken": "broken_mod:Backend"},
        {"broken_mod": "raise RuntimeError('boom at import')\n"},
    )
    make_dist(
        site,
        "future-backend",
        {"future": "future_mod:Backend"},
        {"future_mod": GOOD.format(name="future").replace(f"api_version = {API_VERSION}", "api_version = 99")},
    )
    make_dist(site, "fine-backend", {"fine": "fine_mod:Backend"}, {"fine_mod": GOOD.format(name="fine")})
    monkeypatch.syspath_prepend(str(site))  # also invalidates importlib's caches
    for mod in ("broken_mod", "future_mod", "fine_mod"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    return site


@pytest.fixture
def registry(site, tmp_path):
    return Registry(settings_file=tmp_path / "plugins.json")


def test_discovery_reads_metadata_without_importing(registry):
    infos = {i.name: i for i in registry.discover()}
    assert {"torch", "mlx", "broken", "future", "fine"} <= infos.keys()
    assert infos["broken"].dist_name == "broken-backend" and infos["broken"].dist_version == "0.3"
    assert infos["fine"].target == "fine_mod:Backend" and infos["fine"].status == "not loaded"
    assert not {"broken_mod", "future_mod", "fine_mod"} & sys.modules.keys()


def test_engine_lists_plugins_without_importing_them_or_their_frameworks():
    code = (
        "import json, sys, opscope.engine.backends as b; names = [i.name for i in b.list_backends(load=False)];"
        "print(json.dumps([names, [m for m in sys.modules if m.removeprefix('opscope.').split('.')[0] in ('plugins', 'mlx', 'torch')]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    names, imported = json.loads(out.stdout)
    assert {"mlx", "torch"} <= set(names) and imported == []


def test_broken_plugin_is_listed_as_failed_while_the_others_work(registry):
    infos = {i.name: i for i in registry.infos(load=True)}
    assert infos["broken"].status == "failed"
    assert "broken-backend 0.3" in infos["broken"].error and "boom at import" in infos["broken"].error
    assert infos["fine"].status == "ok" and infos["fine"].devices == (DeviceInfo("cpu", "cpu", True),)
    assert infos["torch"].status == "ok" and infos["mlx"].status == "ok"
    with pytest.raises(BackendError, match="'broken'.*boom at import") as e:
        registry.get("broken")
    assert isinstance(e.value.__cause__, RuntimeError)
    assert registry.get("fine").name == "fine"


def test_incompatible_api_version_is_refused_with_both_versions(registry):
    info = registry.info("future")
    assert info.status == "incompatible"
    assert "v99" in info.error and f"v{API_VERSION}" in info.error and "upgrade OpScope" in info.error
    with pytest.raises(BackendError, match="incompatible"):
        registry.get("future")


def test_plugin_missing_required_members_is_incompatible(site, tmp_path):
    make_dist(
        site,
        "half-backend",
        {"half": "half_mod:Backend"},
        {"half_mod": "class Backend:\n    name = 'half'\n    api_version = 1\n"},
    )
    info = Registry(settings_file=tmp_path / "p.json").info("half")
    assert info.status == "incompatible" and "is_available, devices, load" in info.error


def test_plugin_exiting_at_import_is_not_fatal(site, tmp_path):
    make_dist(site, "exit-backend", {"exits": "exit_mod:Backend"}, {"exit_mod": "raise SystemExit(3)\n"})
    info = Registry(settings_file=tmp_path / "p.json").info("exits")
    assert info.status == "failed" and "SystemExit" in info.error


def test_plugin_exceptions_reach_callers_as_backend_errors_naming_it(registry):
    fine = registry.get("fine")
    with pytest.raises(BackendError, match="'fine' failed in load.*RuntimeError: framework exploded"):
        fine.load(None)
    assert capabilities(fine.plugin) == {"bench_copy"}
    assert fine.bench_copy(8, iterations=2) == [1, 1]
    assert registry.info("fine").capabilities == ("bench_copy",)


def test_engine_errors_from_a_plugin_pass_through_unchanged(registry, tmp_path):
    with pytest.raises(ModelFormatError):
        registry.get("mlx").load(tmp_path / "missing.gguf")


def test_unavailable_backend_says_why(site, tmp_path):
    source = GOOD.format(name="gone").replace('return True, ""', 'return False, "needs the Gone SDK"')
    make_dist(site, "gone-backend", {"gone": "gone_mod:Backend"}, {"gone_mod": source})
    reg = Registry(settings_file=tmp_path / "p.json")
    assert reg.info("gone").status == "unavailable" and reg.info("gone").reason == "needs the Gone SDK"
    with pytest.raises(BackendError, match="not available here: needs the Gone SDK"):
        reg.get("gone")
    assert reg.get("gone", require_available=False).name == "gone"


def test_unknown_backend_lists_the_installed_ones(registry):
    with pytest.raises(BackendError, match=r"no backend plugin named 'nope' \(installed: .*mlx.*torch"):
        registry.get("nope")


def test_disabled_plugin_is_not_imported_and_the_choice_persists(site, tmp_path):
    settings = tmp_path / "plugins.json"
    set_enabled("fine", False, settings)
    reg = Registry(settings_file=settings)
    assert reg.info("fine").status == "disabled" and "fine_mod" not in sys.modules
    with pytest.raises(BackendError, match="disabled: run `opscope plugins enable fine`"):
        reg.get("fine")
    set_enabled("fine", True, settings)
    reg.refresh()
    assert reg.info("fine").status == "ok"
    assert json.loads(settings.read_text()) == {"disabled": []}


def test_settings_live_in_the_user_config_dir_and_survive_damage(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert settings_path() == tmp_path / "cfg" / "opscope" / "plugins.json"
    settings_path().parent.mkdir(parents=True)
    settings_path().write_text("{not json")
    assert disabled_plugins() == frozenset()
    set_enabled("mlx", False)
    assert disabled_plugins() == {"mlx"}


def test_unwritable_settings_raise_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot save plugin settings"):
        set_enabled("mlx", False, blocker / "plugins.json")


# -- the CLI ---------------------------------------------------------------------------------------
def run_cli(*args: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "opscope.engine.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_cli_lists_failed_plugins_and_keeps_working(site):
    out = run_cli("plugins", "list", extra_path=site)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    broken = next(i for i, line in enumerate(lines) if line.startswith("broken"))
    assert "failed" in lines[broken] and "broken-backend 0.3" in lines[broken]
    assert "boom at import" in lines[broken + 1]
    assert any(line.startswith("torch") and " ok " in line for line in lines)
    assert any("device cpu" in line for line in lines)


@pytest.mark.slow
def test_cli_json_enable_disable_round_trip():
    assert run_cli("plugins", "disable", "mlx").returncode == 0
    listed = {p["name"]: p for p in json.loads(run_cli("plugins", "list", "--json", "--no-load").stdout)}
    assert listed["mlx"]["status"] == "disabled" and listed["mlx"]["enabled"] is False
    assert listed["torch"]["version"] == listed["mlx"]["version"]
    assert run_cli("plugins", "enable", "mlx").returncode == 0
    listed = {p["name"]: p for p in json.loads(run_cli("plugins", "list", "--json").stdout)}
    assert listed["mlx"]["status"] == "ok" and listed["mlx"]["devices"][0]["name"] == "cpu"


def test_cli_refuses_unknown_names_with_one_line():
    out = run_cli("plugins", "disable", "nope")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no backend plugin named 'nope'" in out.stderr


def test_default_registry_helpers_agree(monkeypatch):
    registry_mod.refresh()
    names = [i.name for i in registry_mod.list_backends(load=False)]
    assert names == sorted(names) and {"torch", "mlx"} <= set(names)
    assert registry_mod.get_backend("mlx").name == "mlx"


class _Recorder:
    """A backend built on BackendBase that records what reaches its own part."""

    def __init__(self, available: tuple[bool, str]):
        from opscope.engine import BackendBase

        class Plugin(BackendBase):
            name = "recorder"
            load_options = frozenset({"threads"})
            calls: list = []

            def is_available(self):
                return available

            def load_model(self, source, device, dtype, **options):
                self.calls.append((source, device, dtype, options))
                return "model"

        self.plugin = Plugin()


def test_backend_base_checks_options_and_availability_before_the_plugins_own_load():
    ok = _Recorder((True, "")).plugin
    assert ok.load("m.gguf", threads=2) == "model"
    assert ok.calls == [("m.gguf", "cpu", "float32", {"threads": 2})]
    with pytest.raises(ConfigError) as e:
        ok.load(None, flash=True, beam=2)
    assert str(e.value) == "recorder backend: unknown option(s) beam, flash"
    off = _Recorder((False, "needs the moon: pip install moon")).plugin
    with pytest.raises(BackendError) as e:
        off.load(None)
    assert str(e.value) == "backend 'recorder' is not available: needs the moon: pip install moon"
    assert off.calls == [] and off.api_version == API_VERSION


def test_built_in_backends_share_the_base_load():
    from opscope.engine import BackendBase
    from opscope.plugins.mlx_backend import MLXBackend
    from opscope.plugins.torch_backend import TorchBackend

    for cls in (TorchBackend, MLXBackend):
        assert issubclass(cls, BackendBase) and "load" not in vars(cls), cls
    with pytest.raises(ConfigError) as e:
        MLXBackend().load(None, fastpath="off")
    assert str(e.value) == "mlx backend: unknown option(s) fastpath"
