"""Which message properties the PUT logs hold, and the types each was sent
with: what `taproot_messages` (storage/views.py) makes a column of.

A scan of the whole PUT log would find them too, but it grows with the log
and a long-lived endpoint would pay it at every refresh of its views. So
`PropertyKinds` keeps what it found per data file: a refresh reads the
property columns of the files it has not seen (new commits, compaction's
outputs, a few MiB each) and forgets the files a table no longer has
(compacted, trimmed by retention), so a name nothing holds any more goes
away with its last file.

    kinds = PropertyKinds()
    kinds.read(["data/partition-000/puts"])   # {"region": {"string"}, "n": {"int64"}}
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from storage import deltars

_PAIRS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))


def batch_kinds(properties: pa.Array | pa.ChunkedArray, property_types: pa.Array | pa.ChunkedArray | None
                ) -> dict[str, frozenset[str]]:
    """Each property name in `properties` (a map column), with the types
    `property_types` gives it on the same rows (nulls, and types of names
    a row does not carry, count nowhere): as Spark's
    `collect_set(property_types[k])` over `explode(map_keys(properties))`."""
    lists = properties.cast(_PAIRS)
    flat = pc.list_flatten(lists)
    if len(flat) == 0:
        return {}
    rows, keys = pc.list_parent_indices(lists), pc.struct_field(flat, "key")
    found: dict[str, frozenset[str]] = {key: frozenset() for key in pc.unique(keys).to_pylist()}
    if property_types is None:
        return found
    type_lists = property_types.cast(_PAIRS)
    type_flat = pc.list_flatten(type_lists)
    type_rows, type_keys = pc.list_parent_indices(type_lists), pc.struct_field(type_flat, "key")
    types = pc.struct_field(type_flat, "value")
    if not (keys.equals(type_keys) and rows.equals(type_rows)):
        # Rows whose types name other properties, or in another order (not
        # what Taproot writes): pair them up by row and name.
        paired = pa.table({"row": rows, "key": keys}).join(
            pa.table({"row": type_rows, "key": type_keys, "type": types}), ["row", "key"], join_type="left outer")
        keys, types = paired["key"], paired["type"]
    # Each distinct (name, type) pair once, joined by a NUL; split at the
    # last one, since a type name holds none (a property name may).
    for pair in pc.unique(pc.binary_join_element_wise(keys, types, "\x00")).to_pylist():
        if pair is not None:
            key, kind = pair.rsplit("\x00", 1)
            found[key] |= {kind}
    return found


def _file_kinds(uri: str) -> dict[str, frozenset[str]]:
    store, path = deltars.file_system(uri)
    with store.open_input_file(path) as source:
        data = pq.ParquetFile(source)
        present = set(data.schema_arrow.names)
        if "properties" not in present:
            return {}
        columns = ["properties"] + (["property_types"] if "property_types" in present else [])
        found: dict[str, frozenset[str]] = {}
        for batch in data.iter_batches(columns=columns, batch_size=65536):
            _merge_into(found, batch_kinds(batch.column("properties"),
                                           batch.column("property_types") if "property_types" in present else None))
        return found


def _merge_into(found: dict[str, frozenset[str]], more: dict[str, frozenset[str]]) -> None:
    for key, kinds in more.items():
        found[key] = found.get(key, frozenset()) | kinds


class PropertyKinds:
    """The property names and their types over some PUT logs, kept per data
    file between reads (module docstring). One thread uses an instance."""

    def __init__(self) -> None:
        self._tables: dict[str, DeltaTable] = {}
        self._files: dict[str, dict[str, frozenset[str]]] = {}
        self.files_read = 0   # data files whose properties were read, over this instance's life
        self.last: dict[str, frozenset[str]] = {}   # what the last `read` returned

    def read(self, paths: list[str]) -> dict[str, frozenset[str]]:
        """Name -> types over the latest version of each PUT log in `paths`
        (a log not created yet holds none)."""
        present: list[str] = []
        for path in paths:
            table = self._tables.get(path)
            if table is None:
                table = deltars.try_open(path)
                if table is None:
                    continue
                self._tables[path] = table
            else:
                table.update_incremental()
            present.extend(table.file_uris())
        for uri in present:
            if uri not in self._files:
                self._files[uri] = _file_kinds(uri)
                self.files_read += 1
        for uri in self._files.keys() - set(present):
            del self._files[uri]
        found: dict[str, frozenset[str]] = {}
        for kinds in self._files.values():
            _merge_into(found, kinds)
        self.last = found
        return found
