"""An ODBC driver manager that cannot load the driver a connection names: an installation (or
spelling) problem that no retry fixes, so the MSSQL connector and ledger refuse it as such
instead of reporting a retryable outage."""

from __future__ import annotations

from dpone import errors
from dpone.errors import DponeError

#: the driver manager's own states: no such data source or driver (IM002), driver not loadable
#: (IM003); unixODBC reports a missing driver library as 01000 "Can't open lib"
_MANAGER_STATES = ("IM002", "IM003")


def driver_not_loadable(exc: BaseException) -> bool:
    """True when ``exc`` (a pyodbc error: SQLSTATE, then the message) says the ODBC driver
    itself could not be found or loaded."""
    state = str(exc.args[0]) if exc.args else ""
    text = " ".join(str(arg) for arg in exc.args[1:])
    return state in _MANAGER_STATES or "Can't open lib" in text


def driver_missing(label: str) -> DponeError:
    """The refusal for :func:`driver_not_loadable` (never the DSN: only its driver is meant)."""
    return DponeError(
        errors.DRIVER_MISSING,
        f"{label}: the ODBC driver the connection names cannot be loaded (not installed here, "
        "or its name is misspelt): install Microsoft's ODBC Driver 18 for SQL Server in the "
        "image, or name an installed one with driver= in the DSN",
    )
