"""The run settings as command-line options, made from `flows.settings.RunSettings` itself: each field becomes one
option (its flag, default and help are the field's), so a setting is spelled once, in the settings class, and
`generate`, `serve` and the Prefect form show the same text.

    @app.command()
    @friendly
    @run_settings(out=None)          # a command may change a default (None: required)
    def serve(settings: RunSettings, cron: str = typer.Option(...)): ...

The command's own options stay in its signature; the settings come in whole as `settings`, built and validated
once. A bad value is one `error: --flag: ...` line (options.friendly).
"""

from __future__ import annotations

import inspect
from typing import Optional, get_args, get_origin, get_type_hints

import typer

from .options import spec_of


def _cli_type(annotation):
    """The type Typer parses a field as: repeated options for a tuple, text for a decode spec, Optional[X] for
    X | None."""
    from ssdgen.decoders.spec import DecodeSpec
    args = get_args(annotation)
    if get_origin(annotation) is tuple:
        return list[args[0]]
    if type(None) in args:  # X | None
        return Optional[next(a for a in args if a is not type(None))]
    if annotation is DecodeSpec:  # pydantic keeps the field's type without its Annotated validators
        return str
    return annotation


def _flag(name: str, info) -> str:
    extra = info.json_schema_extra or {}
    return extra.get("flag") or "--" + name.replace("_", "-")


def settings_parameters(overrides: dict) -> list[inspect.Parameter]:
    """One keyword parameter with a typer.Option per RunSettings field."""
    from pydantic_core import PydanticUndefined

    from ssdgen.flows.settings import RunSettings
    params = []
    first = ("prompts", "out")  # what every run names, then the rest in the settings' order
    names = [*first, *(n for n in RunSettings.model_fields if n not in first)]
    for name in names:
        info = RunSettings.model_fields[name]
        default = overrides.get(name, info.default)
        if default is PydanticUndefined or default is None and name in overrides:
            default = ...  # required
        elif isinstance(default, tuple):  # a repeatable option's default (demo's prompts)
            default = list(default)
        elif not isinstance(default, (str, int, float, bool, type(None))):
            default = str(default)  # a decode spec shows as its text
        # a field marked cli_text is read as text and parsed by pydantic: a bad number is one `error:` line
        ann = Optional[str] if (info.json_schema_extra or {}).get("cli_text") else _cli_type(info.annotation)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann,
                                        default=typer.Option(default, _flag(name, info), help=info.description)))
    return params


def build_settings(values: dict):
    """RunSettings from the options' values, the decode spec parsed by the CLI's one parser (its errors name the
    spec and the key); a value pydantic refuses is one line naming the option."""
    from pydantic import ValidationError

    from ssdgen.flows.settings import RunSettings
    values = values | {"decoder": spec_of(values["decoder"])}
    try:
        return RunSettings(**values)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "settings"
        flag = _flag(name, RunSettings.model_fields[name]) if name in RunSettings.model_fields else name
        raise ValueError(f"{flag}: {err['msg']}") from None


def run_settings(**overrides):
    """Decorator: the command takes every run setting as an option and receives them as `settings`."""
    def decorate(fn):
        hints = get_type_hints(fn)  # the command's own options, their annotations resolved where it is defined
        own = [p.replace(annotation=hints.get(n, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
               for n, p in inspect.signature(fn).parameters.items() if n != "settings"]
        fields = settings_parameters(overrides)
        names = {p.name for p in fields}

        def command(**kwargs):
            settings = build_settings({k: kwargs.pop(k) for k in list(kwargs) if k in names})
            return fn(settings=settings, **kwargs)

        command.__name__, command.__doc__, command.__module__ = fn.__name__, fn.__doc__, fn.__module__
        command.__signature__ = inspect.Signature(fields + own)
        command.__annotations__ = {p.name: p.annotation for p in fields + own}
        return command
    return decorate


__all__ = ["run_settings", "build_settings", "settings_parameters"]
