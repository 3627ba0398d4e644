"""DP-SGD's noise mechanisms, one module each, and their registry: a mechanism's module
declares the mechanism (a `NoiseMechanism`) and its settings (a `NoiseSettings`, how a
study's `algorithm.noise` names it). Every module of this package is read here, so a new
mechanism is one new module (and its tests); everything else finds it in `SETTINGS`."""

import importlib
import pkgutil
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args

from pydantic import BeforeValidator, Field, ValidationError

from dpfl.local.mechanisms.base import (
    STREAMS,
    Buffered,
    CorrelatedNoise,
    Correlation,
    NoiseFilter,
    NoiseMechanism,
    NoiseSettings,
    Recursive,
    Stream,
    forget_streams,
)
from dpfl.local.mechanisms.independent import Independent, IndependentSettings


def _declared() -> dict[str, type[NoiseSettings]]:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found = {}
    pending = list(NoiseSettings.__subclasses__())
    while pending:
        settings = pending.pop()
        pending.extend(settings.__subclasses__())
        (name,) = get_args(settings.model_fields["mechanism"].annotation)
        found[name] = settings
    return dict(sorted(found.items()))


SETTINGS: dict[str, type[NoiseSettings]] = _declared()
"""Every mechanism's settings by the name a study gives it (`algorithm.noise`)."""


def mechanism(name: str, trainings: int = 1, **settings: Any) -> NoiseMechanism:
    """The mechanism `name` with `settings`, for `trainings` trainings (one: a run of one
    training, as `dpfl privacy` accounts it); bad input is one ValueError line."""
    if name not in SETTINGS:
        raise ValueError(f"unknown noise mechanism {name!r} (one of: {', '.join(SETTINGS)})")
    try:
        chosen = SETTINGS[name].model_validate({"mechanism": name, **settings})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"noise mechanism {name!r}: {where}: {first['msg']}") from None
    return chosen.build(trainings)


def _named(raw: Any) -> Any:
    """`noise = "bandmf"` is `[algorithm.noise] mechanism = "bandmf"` with its defaults."""
    return {"mechanism": raw} if isinstance(raw, str) else raw


if TYPE_CHECKING:
    MechanismSettings = NoiseSettings
else:
    MechanismSettings = Annotated[
        Union[tuple(SETTINGS.values())],  # noqa: UP007 (a union built from the registry)
        Field(discriminator="mechanism"),
        BeforeValidator(_named),
    ]
    """A study's `algorithm.noise`: a mechanism's name, or a table naming it with its
    settings (to mypy, any `NoiseSettings`)."""

__all__ = [
    "SETTINGS",
    "STREAMS",
    "Buffered",
    "CorrelatedNoise",
    "Correlation",
    "Independent",
    "IndependentSettings",
    "MechanismSettings",
    "NoiseFilter",
    "NoiseMechanism",
    "NoiseSettings",
    "Recursive",
    "Stream",
    "forget_streams",
    "mechanism",
]
