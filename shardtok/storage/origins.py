"""Which ``storage_options`` each location gets: credentials reach one origin only.

A list of locations (a mix config, a WebDataset URL list) may be someone else's, so options
given once, flat, must not follow it to a second origin: they are refused there with a
``UsageError`` naming the origins, before any request. Flat options serve the origin of the
first location the caller named; a config file's locations were not named by the caller, so
there flat options serve none and a remote location is refused the same way. Options keyed by
origin (``{"https://host": {...}, "s3://": {...}}``) give each location its own origin's, and
no other's. See docs/STORAGE.md, "Origins and redirects".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardtok.errors import UsageError
from shardtok.storage.location import Location, origin_of


def origin_key(where: Location) -> tuple:
    """The origin options belong to: HTTP reaches the host the URL names (scheme, host, port);
    an object store reaches the endpoint its options name, whatever the bucket (its scheme)."""
    scheme, host, port = origin_of(where.url)
    return (scheme, host, port) if scheme in ("http", "https") else (scheme,)


_KEY_THEM = 'key them by origin instead: {"https://host": {...}, "s3://": {...}}'


def options_by_origin(
    storage_options: Mapping[str, Any] | None, *, from_config: bool = False
) -> Callable[[Location], dict | None]:
    """A function giving each location its options (None for local ones), such that they never
    reach another origin (module docstring). A flat dict serves the first remote origin asked
    for (ask for the caller's own locations in the order given); a second one is refused.

    `from_config`: the locations come from a config file, not from the caller: whoever wrote it
    chooses the hosts, so flat options serve none of them and the first remote one is refused
    (the caller's message names the file); options keyed by origin still apply."""
    if not storage_options:
        return lambda where: None
    if all("://" in str(key) for key in storage_options):  # keyed by origin
        by_origin = {origin_key(Location(str(k))): v for k, v in storage_options.items()}
        return lambda where: None if where.is_local else by_origin.get(origin_key(where))
    seen: dict[tuple, str] = {}

    def flat(where: Location) -> dict | None:
        if where.is_local:
            return None
        if from_config:
            raise UsageError(
                f"{where.display}: named by a config file, so it gets no flat storage_options "
                f"(they go only to a location you name yourself); {_KEY_THEM}"
            )
        seen.setdefault(origin_key(where), where.display)
        if len(seen) > 1:
            shown = ", ".join(sorted(seen.values()))
            raise UsageError(
                f"storage_options would be sent to {len(seen)} origins ({shown}); {_KEY_THEM}"
            )
        return dict(storage_options)

    return flat


__all__ = ["options_by_origin", "origin_key"]
