"""The analyst's side of madlib_mop: call the extension from Python (SQLAlchemy), follow
jobs with a progress bar, read results as pandas DataFrames, plot them, and the
`madlib-mop` command (`jobs`, `watch`, `report`, `tensorboard`, `dashboard`: a live web
page of the role's jobs).

Needs the `client` extra: pip install 'madlib_mop[client]'.
"""

from madlib_mop.client.session import Client, JobCancelled, ServerError

__all__ = ["Client", "JobCancelled", "ServerError"]
