"""What the attach children check before they serve (attach/reader.py, attach/writer.py;
the processes themselves: syncpack/children.py)."""

from __future__ import annotations

from syncpack.store import appdb


def file_as_left(app: appdb.Connection, req: dict, module_file: str) -> bool:
    """The child's check before serving: the application's file holds what the caller's
    snapshot held (the same highest change number: every write to an attached table adds a
    change row, and only syncpack, under the site lock, removes them; the same schema
    version), and the child runs the caller's code (``module_file``, the serving module's
    file, as the request names it)."""
    return (appdb.max_seq(app) == req["upto"] and appdb.schema_version(app) == req["schema"]
            and req["module"] == module_file)
