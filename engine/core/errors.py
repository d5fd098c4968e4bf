"""One error hierarchy for everything the engine raises at a user.

Each error carries a message that says what failed, on which object, and what to do. The CLI
prints ``str(err)`` on one line and exits with ``exit_code``; the GUI shows the same text.
"""

from __future__ import annotations

import re
from os import PathLike
from typing import Any


class EngineError(Exception):
    """Root of every error the engine raises on purpose."""

    exit_code = 2

    def for_cli(self) -> str:
        """The message as the `opscope` command prints it (options named as its flags)."""
        return str(self)


class ModelFormatError(EngineError):
    """A model file or directory is missing, corrupt, truncated or hostile."""


class UnsupportedModelError(EngineError):
    """A well-formed model that this engine cannot run (architecture, quantization type)."""


class ConfigError(EngineError):
    """A bad setting: device, dtype, sampling flag, suite parameter.

    ``ConfigError.about_options(template, **given)`` writes a message about keyword options once,
    read two ways. In ``template``, ``{compile}`` names an option, ``{compile=}`` names it with the
    value the caller gave (``given["compile"]``) and ``{fastpath=off}`` with a value that fixes it.
    ``str()`` speaks to API callers (``compile='always'``, ``fastpath='off'``), ``for_cli()`` to
    the command line (``--compile 'always'``, ``--fastpath off``)."""

    template: str | None = None
    given: dict[str, object] | None = None

    @classmethod
    def about_options(cls, template: str, **given: object) -> ConfigError:
        err = cls(_render_options(template, given, cli=False))
        err.template, err.given = template, given
        return err

    def for_cli(self) -> str:
        if self.template is None:
            return str(self)
        return _render_options(self.template, self.given or {}, cli=True)

    def __reduce__(self) -> str | tuple[Any, ...]:  # crosses the worker-process boundary (pickle) with its template
        if self.template is None:
            return super().__reduce__()
        return _about_options, (type(self), self.template, self.given or {})


_OPTION = re.compile(r"\{([a-z_]+)(=[^{}]*)?\}")


def _render_options(template: str, given: dict[str, object], cli: bool) -> str:
    def one(m: re.Match[str]) -> str:
        name, value = m.group(1), m.group(2)
        flag = f"--{name.replace('_', '-')}"
        if value is None:
            return flag if cli else name
        text = repr(given.get(name)) if value == "=" else value[1:]
        if cli:
            return f"{flag} {text}"
        return f"{name}={text}" if value == "=" else f"{name}={text!r}"

    return _OPTION.sub(one, template)


def _about_options(cls: type[ConfigError], template: str, given: dict[str, object]) -> ConfigError:
    return cls.about_options(template, **given)


class InsufficientMemory(EngineError):
    """Work that would not fit in the memory this machine has free now."""


class DeviceError(EngineError):
    """The requested device does not exist or is not usable."""


class BackendError(EngineError):
    """A backend plugin is missing, failed to load, or is incompatible."""


class StoreError(EngineError):
    """The run store cannot be opened, migrated or written."""


class RunNotFoundError(StoreError):
    """No saved run matches the id or name given."""


class Cancelled(EngineError):
    """A long operation was cancelled by the user."""

    exit_code = 130


# -- model files that fail validation ------------------------------------------------------------
class ModelLoadError(ModelFormatError):
    """A model file failed validation before anything was allocated from it.

    The message is ``"{path}: {detail}; {fix}"``: the file, what is wrong where (key, tensor, byte
    offset) and what to do. ``fix`` defaults to the class's advice."""

    fix = "the file is damaged or was not written by a GGUF/safetensors converter; download or convert it again"

    def __init__(self, path: str | PathLike[str] | None, detail: str, fix: str | None = None):
        self.path, self.detail, self.fix = path, detail, fix or self.fix
        where = f"{_printable(str(path))}: " if path is not None else ""
        super().__init__(f"{where}{_printable(detail, 600)}; {self.fix}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses the worker-process boundary (pickle) with its fields
        return type(self), (self.path, self.detail, self.fix)

    def at(self, path: str | PathLike[str]) -> ModelLoadError:
        """The same error naming ``path`` (for checks that run before the file is known)."""
        return type(self)(path, self.detail, self.fix)


def _printable(text: str, limit: int | None = None) -> str:
    """One line whatever a hostile file put in a name: control characters escaped, length capped."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


class NotARegularFile(ModelLoadError):
    fix = "give the path of a .gguf or .safetensors file or of a Hugging Face model directory"


class Truncated(ModelLoadError):
    fix = "the file is incomplete (an interrupted download or copy); download it again"


class BadMagic(ModelLoadError):
    fix = "give a .gguf file, a .safetensors file or a Hugging Face model directory"


class UnsupportedVersion(ModelLoadError, UnsupportedModelError):
    fix = "convert the model again with a current llama.cpp (GGUF versions 2 and 3 are read)"


class LimitExceeded(ModelLoadError):
    pass


class WrongMetadataType(ModelLoadError):
    pass


class DuplicateEntry(ModelLoadError):
    fix = "a key or tensor may appear only once; the file is damaged or was tampered with, convert it again"


class MissingMetadata(ModelLoadError):
    fix = "the converter left out a field this architecture needs; convert the model again with a current tool"


class InvalidHyperparameters(ModelLoadError):
    fix = "the model's sizes are inconsistent; the file is damaged or was tampered with, convert it again"


class TensorOutOfBounds(ModelLoadError):
    pass


class TensorMisaligned(ModelLoadError):
    pass


class TensorOverlap(ModelLoadError):
    pass


class MissingTensor(ModelLoadError):
    fix = "the file does not hold every weight its architecture needs; convert the model again"


class UnsafeFormat(ModelLoadError):
    fix = (
        "pickle files can run arbitrary code when loaded, so they are never opened; convert the weights to "
        "safetensors (e.g. transformers' save_pretrained(..., safe_serialization=True)) or to GGUF"
    )


class ChatTemplateError(ModelLoadError):
    fix = "fix or remove the chat template in the model's metadata, or run without --chat"


class UnsafeTemplate(ChatTemplateError):
    fix = "the template was stopped by the sandbox's limits; remove or fix the model's chat template"


class DistributedError(EngineError):
    """A rank of a multi-process run failed, hung past its timeout, or could not rendezvous."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C (engine.cli's handler) so that every clean-up that handles Ctrl-C
    runs for it too; a loop that survives Ctrl-C (the chat) must let this one through."""
