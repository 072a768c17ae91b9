"""The client's errors: the server's (SQLSTATE, message, detail, hint) and a cancelled job."""

from __future__ import annotations


class ServerError(Exception):
    """An error the server raised: its SQLSTATE, message, detail and hint."""

    def __init__(self, sqlstate: str | None, message: str, detail: str | None = None,
                 hint: str | None = None):
        self.sqlstate, self.message, self.detail, self.hint = sqlstate, message, detail, hint
        text = f"[{sqlstate}] {message}" if sqlstate else message
        if detail:
            text += f"\nDETAIL: {detail}"
        if hint:
            text += f"\nHINT: {hint}"
        super().__init__(text)


class JobCancelled(KeyboardInterrupt):
    """Ctrl-C during a training call: the job was cancelled on the server and can continue."""

    def __init__(self, job_id: int | None, schema: str, done: str = ""):
        self.job_id = job_id
        if job_id is None:
            message = ("cancelled before its job was running; the same call again starts it, or "
                       "continues it if it was recorded")
        else:
            message = (f"job {job_id} cancelled{done}; continue it with mop.resume({job_id}), "
                       f"CALL {schema}.resume({job_id}), or the same call again")
        super().__init__(message)


def server_error(error: BaseException) -> BaseException:
    """SQLAlchemy's wrapped driver error as a ServerError (others unchanged)."""
    original = getattr(error, "orig", error)
    diag = getattr(original, "diag", None)
    if diag is None or getattr(diag, "sqlstate", None) is None:
        return error
    return ServerError(diag.sqlstate, diag.message_primary or str(original),
                       diag.message_detail, diag.message_hint)
