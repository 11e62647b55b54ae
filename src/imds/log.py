"""structlog setup: JSON lines on stderr. Called once by the CLI.

Nothing in imds logs a metadata document, userdata, token or password: log calls pass
ids, counts and addresses only.
"""

from __future__ import annotations

import logging
import sys

import structlog

QUIET_DRIVERS = ("aiosqlite", "sqlalchemy", "asyncpg")
QUIET_CLIENTS = ("httpx", "httpcore")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info") -> None:
    """Send structlog events and stdlib logging (uvicorn, alembic) to stderr as JSON lines."""
    numeric = _LEVELS[level]
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,  # uvicorn's "Exception in ASGI application" with its traceback
                structlog.processors.JSONRenderer(),
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # uvicorn's access log would log every instance read; our own request metrics replace it.
    logging.getLogger("uvicorn.access").disabled = True
    # Alembic narrates every plugin it loads at INFO; its migration lines are enough.
    logging.getLogger("alembic.runtime.plugins").setLevel(max(numeric, logging.WARNING))
    # Database drivers log every statement WITH its parameters at debug/info (aiosqlite's
    # "executing ... ('{...document...}', ...)"): private OS parameters, metadata and
    # passwords would reach the log. They stay at WARNING whatever --log-level says
    # (tests/security/test_secrets_canary.py greps a debug-level log for this).
    for driver in QUIET_DRIVERS:
        logging.getLogger(driver).setLevel(max(numeric, logging.WARNING))
    # httpx narrates every request at INFO ("HTTP Request: GET ... 200 OK"): an access log of our
    # own calls (the CLI's --url, the proxy's forwards, upstream lookups), one JSON line each on
    # the stderr of a command whose answer is on stdout. Failures reach us as exceptions.
    for client in QUIET_CLIENTS:
        logging.getLogger(client).setLevel(max(numeric, logging.WARNING))


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to a component name."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(component=name)
    return logger
