from pathlib import Path

import pytest
from pydantic import ValidationError

import app.core.settings as settings_module
from app.cli import limit_blas_threads, serve
from app.core.errors import ConfigError
from app.core.settings import Settings, load_settings


def test_environment_configures_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECSYS_REDIS_URL", "unix:///run/redis.sock")
    monkeypatch.setenv("RECSYS_CANDIDATE_COUNT", "2500")
    settings = Settings()
    assert settings.redis_url == "unix:///run/redis.sock"
    assert settings.candidate_count == 2500


@pytest.mark.parametrize(
    ("name", "value"),
    [("RECSYS_CANDIDATE_COUNT", "0"), ("RECSYS_CANDIDATE_COUNT", "9000"), ("RECSYS_PORT", "x")],
)
def test_invalid_environment_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("RECSYS_").lower()):
        Settings()


@pytest.mark.parametrize("proxies", ["*", "0.0.0.0/0", "10.0.0.1,::/0", "proxy.local"])
def test_trusted_proxies_that_would_believe_anyone_are_refused(proxies: str) -> None:
    with pytest.raises(ConfigError, match=r"RECSYS_TRUSTED_PROXIES.*name the proxies"):
        load_settings(trusted_proxies=proxies)


def test_trusted_proxies_are_addresses_or_networks() -> None:
    named = "10.0.0.1, 192.168.0.0/24, ::1"
    assert load_settings(trusted_proxies=named).trusted_proxies == named


@pytest.mark.parametrize("workers", [0, 65])
def test_workers_from_the_command_line_get_the_settings_bounds(workers: int) -> None:
    with pytest.raises(ConfigError, match="RECSYS_WORKERS"):
        serve(workers=workers)


def test_a_short_admin_token_is_refused_without_showing_it() -> None:
    secret = "short-secret"
    with pytest.raises(ConfigError, match="RECSYS_ADMIN_TOKEN: Value error, must be 16") as raised:
        load_settings(admin_token=secret)
    assert secret not in str(raised.value)
    assert load_settings(admin_token="x" * 16).admin_token is not None


def test_secrets_come_from_files_and_never_into_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settings_module, "SECRETS_DIR", tmp_path)
    (tmp_path / "recsys_admin_token").write_text("a-token-of-24-characters")
    (tmp_path / "recsys_redis_password").write_text("redis-secret")
    loaded = load_settings()
    assert loaded.admin_token is not None
    assert loaded.admin_token.get_secret_value() == "a-token-of-24-characters"
    assert loaded.redis_password is not None
    assert loaded.redis_password.get_secret_value() == "redis-secret"
    (tmp_path / "recsys_admin_token").write_text("short-secret")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert "RECSYS_ADMIN_TOKEN" in str(refused.value)
    assert "short-secret" not in str(refused.value)


def test_the_server_keeps_blas_to_one_thread_unless_told_otherwise() -> None:
    environ: dict[str, str] = {}
    limit_blas_threads(environ)
    assert environ == {"OPENBLAS_NUM_THREADS": "1"}
    mine = {"OPENBLAS_NUM_THREADS": "4"}
    limit_blas_threads(mine)
    assert mine == {"OPENBLAS_NUM_THREADS": "4"}
