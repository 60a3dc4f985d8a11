"""Settings: one cached `get_settings()` (pydantic-settings, env prefix MESHYARD_)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MESHYARD_", extra="ignore")

    data_dir: Path = Field(default=Path(".meshyard"), description="State, logs, run dirs.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/meshyard.db"
    )
    host: str = "127.0.0.1"
    port: int = 8470
    admin_token: str | None = Field(default=None, description="Seeds a known admin token.")
    allow_fault_injection: bool = Field(
        default=False, description="Accept the inject_fault block in job specs (tests, demos)."
    )
    ray_address: str | None = Field(default=None, description="Existing Ray cluster; else local.")
    cluster_file: Path | None = Field(default=None, description="Declared topology YAML.")
    scheduler_enabled: bool = Field(default=True, description="Run the scheduler loop.")
    max_body_bytes: int = 1024 * 1024
    warm_pool: int = Field(
        default=0, ge=0, le=64,
        description="Pre-started worker actors per CPU node, reused across jobs (0 = off).",
    )

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'meshyard.db').resolve()}"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
