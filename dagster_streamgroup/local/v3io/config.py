"""Server settings; the few knobs beyond the CLI flags come from ``STREAMGROUP_V3IO_*`` variables."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

DEFAULT_CONTAINERS = ("bigdata", "users")


class ServerConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    containers: tuple[str, ...] = Field(
        DEFAULT_CONTAINERS, description="Containers that exist (any other name answers 'Container not found')."
    )
    access_key: SecretStr | None = Field(
        None, description="When set, requests must carry this key; otherwise any non-empty key passes."
    )
    synchronous: Literal["FULL", "NORMAL"] = Field(
        "NORMAL",
        description="SQLite synchronous mode: NORMAL keeps every acknowledged write through a killed server; "
        "FULL also fsyncs each one, surviving power loss at a few milliseconds per write.",
    )
    hour_seconds: float = Field(
        3600.0, gt=0, description="Seconds in one retention hour (tests shorten it to watch retention trim)."
    )
    max_body_bytes: int = Field(64 << 20, gt=0, description="Largest request body accepted (413 above it).")

    @field_validator("containers")
    @classmethod
    def _check_containers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"container name {name!r} must be a non-empty name without '/'")
        if not value:
            raise ValueError("at least one container is needed")
        return value

    @classmethod
    def from_env(cls, access_key: str | None = None) -> ServerConfig:
        env = os.environ
        values: dict[str, object] = {"access_key": SecretStr(access_key) if access_key else None}
        if containers := env.get("STREAMGROUP_V3IO_CONTAINERS"):
            values["containers"] = tuple(c.strip() for c in containers.split(",") if c.strip())
        if sync := env.get("STREAMGROUP_V3IO_SYNC"):
            values["synchronous"] = sync.upper()
        if hour := env.get("STREAMGROUP_V3IO_HOUR_SECONDS"):
            values["hour_seconds"] = hour
        return cls.model_validate(values)
