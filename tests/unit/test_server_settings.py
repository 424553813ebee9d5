"""`troth serve` settings: the flags and TROTH_* variables that thread mode took with it."""

from __future__ import annotations

import pytest

from troth_server.config import Settings, build_parser, settings_from


@pytest.mark.parametrize(
    ("argv", "environ", "named"),
    [
        (["--grpc-mode", "thread"], {}, "--grpc-mode thread"),
        ([], {"TROTH_GRPC_MODE": "thread"}, "TROTH_GRPC_MODE thread"),
        (["--grpc-mode", "threads"], {}, "--grpc-mode threads"),
        (["--grpc-workers", "8"], {}, "--grpc-workers 8"),
        ([], {"TROTH_GRPC_WORKERS": "8"}, "TROTH_GRPC_WORKERS 8"),
    ],
)
def test_thread_mode_settings_are_refused_saying_it_was_removed(
    argv: list[str], environ: dict[str, str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        settings_from(argv, environ)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert named in err
    assert "thread mode was removed" in err
    assert "Drop the setting" in err


@pytest.mark.parametrize(
    ("argv", "environ"),
    [(["--grpc-mode", "aio"], {}), ([], {"TROTH_GRPC_MODE": "aio"}), (["--grpc-mode", "AIO"], {})],
)
def test_grpc_mode_aio_is_still_accepted_and_changes_nothing(
    argv: list[str], environ: dict[str, str]
) -> None:
    assert settings_from(argv, environ) == Settings()


def test_the_removed_flags_are_not_in_the_help() -> None:
    text = build_parser().format_help()
    assert "--grpc-mode" not in text
    assert "--grpc-workers" not in text


def test_the_schema_check_limits_are_flags_and_variables() -> None:
    settings = settings_from(
        ["--max-value-depth", "8", "--max-schema-steps", "1000"],
        {"TROTH_MAX_UNIQUE_ITEMS": "50", "TROTH_MAX_SCHEMA_DEPTH": "12"},
    )
    bounds = settings.limits.schema_bounds()
    assert (bounds.max_value_depth, bounds.max_schema_steps) == (8, 1000)
    assert (bounds.max_unique_items, bounds.max_schema_depth) == (50, 12)
    assert bounds.max_check_depth == 128


def test_server_durations_are_the_clis_one_syntax() -> None:
    from datetime import timedelta

    from troth._cli.args import parse_duration

    settings = settings_from(["--default-ttl", "1h30m", "--max-ttl", "7d", "--sweep-interval",
                              "1.5s", "--retention", "0"], environ={})  # fmt: skip
    assert settings.limits.default_ttl_ms == 5_400_000
    assert settings.limits.max_ttl_ms == 7 * 86_400_000
    assert settings.sweep_interval_ms == 1500 and settings.retention_ms == 0
    # The CLI reads the same text the same way.
    assert parse_duration("1h30m") == timedelta(milliseconds=5_400_000)
    assert parse_duration("1.5s") == timedelta(milliseconds=1500)
    for bad in ("soon", "1h 30m", "90", "-5s", "1x"):
        with pytest.raises(SystemExit):
            settings_from(["--default-ttl", bad], environ={})


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--db-transaction-pooling", "--db-listen-url", "postgresql://pg/troth"], {}),
        (
            [],
            {
                "TROTH_DB_TRANSACTION_POOLING": "true",
                "TROTH_DB_LISTEN_URL": "postgresql://pg/troth",
            },
        ),
    ],
)
def test_a_transaction_pooled_db_with_a_listener_url_of_its_own_is_taken(
    argv: list[str], environ: dict[str, str]
) -> None:
    settings = settings_from(argv, environ)
    assert settings.db_transaction_pooling
    assert settings.db_listen_url == "postgresql://pg/troth"


@pytest.mark.parametrize(
    ("argv", "environ"),
    [(["--db-transaction-pooling"], {}), ([], {"TROTH_DB_TRANSACTION_POOLING": "1"})],
)
def test_a_transaction_pooled_db_without_a_listener_url_is_refused_saying_why(
    argv: list[str], environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        settings_from(argv, environ)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "LISTEN" in err
    assert "give --db-listen-url (TROTH_DB_LISTEN_URL)" in err
