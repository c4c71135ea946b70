"""Hugging Face `datasets` folders as inputs: what ``save_to_disk`` wrote, read from its state.json.

A ``Dataset.save_to_disk`` folder holds ``dataset_info.json``, ``state.json`` and the data, Arrow
IPC stream files named in order by ``state.json``'s ``_data_files``. Its rows are those files'
rows in that order, so that is the order the conversion reads them in. state.json is someone
else's file: it is checked (every name a plain ``.arrow`` file name of that folder, none twice) and
nothing outside the folder is ever read. A ``DatasetDict`` folder (``dataset_dict.json`` and one
such folder per split) is not guessed at: the error names its splits and how to pick one.
"""

from __future__ import annotations

import json

from shardtok.errors import ShardtokError

STATE = "state.json"
INFO = "dataset_info.json"
DATASET_DICT = "dataset_dict.json"


class HFDatasetError(ShardtokError):
    """A Hugging Face datasets folder that cannot be read as an input, said in one line."""


def folder_kind(names) -> str | None:
    """What the file names directly in a folder make it: "dataset" (save_to_disk of a Dataset),
    "dataset_dict", "cache" (dataset_info.json alone: a datasets cache folder), or None."""
    names = set(names)
    if DATASET_DICT in names:
        return "dataset_dict"
    if STATE in names and INFO in names:
        return "dataset"
    if INFO in names:
        return "cache"
    return None


def join_name(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name if folder else name


def data_files(folder: str, state: bytes) -> list[str]:
    """The data file names state.json (its bytes `state`) lists, in order; `folder` names the
    folder in messages. HFDatasetError when state.json is not what save_to_disk writes."""
    where = join_name(folder, STATE)

    def refuse(problem: str) -> HFDatasetError:
        return HFDatasetError(f"{where}: {problem} (not a datasets save_to_disk state)")

    try:
        doc = json.loads(state)
    except (UnicodeDecodeError, ValueError) as exc:
        raise refuse(f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or "_data_files" not in doc:
        raise refuse("no _data_files")
    if doc.get("_indices_data_files"):
        raise HFDatasetError(
            f"{where}: the dataset has an indices mapping (_indices_data_files, written by an old "
            "datasets): load it with datasets and save_to_disk it again"
        )
    entries = doc["_data_files"]
    if not isinstance(entries, list):
        raise refuse("_data_files is not a list")
    if not entries:
        raise HFDatasetError(f"{where}: an empty dataset (_data_files lists no data file)")
    names: list[str] = []
    seen: set[str] = set()  # a list someone else wrote may be long: no quadratic search
    for i, entry in enumerate(entries):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise refuse(f"_data_files[{i}] has no filename")
        if (
            not name
            or name.startswith(".")
            or any(c in name for c in "/\\\0")
            or not name.endswith(".arrow")
        ):
            raise HFDatasetError(
                f"{where}: _data_files[{i}] names {ascii(name)}, not an .arrow file of this folder "
                "(only plain file names are read, never a path)"
            )
        if name in seen:
            raise HFDatasetError(f"{where}: _data_files names {ascii(name)} twice")
        seen.add(name)
        names.append(name)
    return names


def missing_file_error(folder: str, name: str) -> HFDatasetError:
    # ascii(): a look-alike or invisible character is what makes a listed name "missing"
    return HFDatasetError(
        f"{join_name(folder, STATE)} lists {ascii(name)}, which is not in the folder"
    )


def outside_error(folder: str, name: str) -> HFDatasetError:
    return HFDatasetError(
        f"{join_name(folder, name)}: a link to a file outside the dataset folder (not read)"
    )


def dataset_dict_error(folder: str, dataset_dict: bytes | None, subfolders: list[str]):
    """The error for a DatasetDict folder: its splits (from dataset_dict.json, else the
    subfolders holding a state.json), and how to convert one."""
    splits = None
    try:
        doc = json.loads(dataset_dict) if dataset_dict is not None else None
        if isinstance(doc, dict) and isinstance(doc.get("splits"), list):
            # its order, but only real splits: the message suggests one as a path to convert
            splits = [s for s in doc["splits"] if isinstance(s, str) and s in subfolders]
    except (UnicodeDecodeError, ValueError):
        pass
    splits = splits or sorted(subfolders)
    shown = folder.rstrip("/") or "."
    if not splits:
        return HFDatasetError(f"{shown}: a Hugging Face DatasetDict folder with no splits")
    return HFDatasetError(
        f"{shown}: a Hugging Face DatasetDict (splits: {', '.join(splits)}), not one dataset: "
        f"convert a split's folder, e.g. {join_name(shown, splits[0])}, or name several"
    )


def cache_error(folder: str) -> HFDatasetError:
    shown = folder.rstrip("/") or "."
    return HFDatasetError(
        f"{shown}: holds {INFO} but no {STATE}, so it is not a save_to_disk folder (a datasets "
        "cache folder?): name the .arrow files of the split to convert instead"
    )
