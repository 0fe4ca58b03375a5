"""The one error hierarchy. Library code raises these; the CLI renders them in one place."""

from __future__ import annotations


class OptlabError(Exception):
    """A problem the user can fix. `hint` says how; `exit_code` is what the CLI returns
    (docs/exit-codes.md)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nhint: {self.hint}"
        return self.message


class ConfigError(OptlabError):
    """An experiment file is missing, unreadable or invalid. `at` is the key path of the
    field at fault, where a check knows it and the caller adds the file and line."""

    def __init__(
        self, message: str, hint: str | None = None, *, at: tuple[str | int, ...] | None = None
    ) -> None:
        super().__init__(message, hint)
        self.at = at


class RefusedError(OptlabError):
    """The plan was refused: more than one variable, a hidden-variable change, an edited config."""


class StoreError(OptlabError):
    """The database cannot be used as it is (wrong schema version, unreachable)."""


class StoreUnavailable(StoreError):
    """The database failed for a reason that may pass: connection refused or lost, the server
    shutting down, a lock held too long, a full disk. Worth retrying later; nothing is wrong
    with the database itself."""


class NotFoundError(OptlabError):
    """A named experiment, run or file does not exist."""


class TargetError(OptlabError):
    """The target could not be built or set up: the run is FAILED, with this message stored."""
