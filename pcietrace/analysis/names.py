"""Range names grouped, and the ranges a screen shows: what turns a range per op into a table a person reads.

PyTorch's ``torch.autograd.profiler.emit_nvtx`` names every op instance apart (``aten::linear, seq = 12,
op_id = 6088, sizes = [[4, 256], [1024, 256], [1024]], input_op_ids = [(6081,0), (0,-1)]``): thousands of
distinct names a step. Grouped by op they are one row each (``aten::linear``); every instance keeps its full name
in ``range_instances``. Stateless: Series and DataFrames in and out, vectorised over distinct names.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

#: How range names are grouped (``attach``/``report`` ``--group-by``): "op" strips what emit_nvtx appends to an
#: op's name and PyTorch's deep namespaces before it (the default: other names are unchanged), "numbered" also
#: folds a trailing number (``layer0`` ... ``layer31`` -> ``layer#``), "name" keeps every distinct name.
GROUP_BY = ("op", "numbered", "name")
DEFAULT_GROUP_BY = "op"
#: What emit_nvtx appends to an op's name, from the first of these fields on (PyTorch's profiler: ``seq``,
#: ``op_id``, ``sizes`` with record_shapes, ``input_op_ids``; the order varies between versions).
_EMIT_SUFFIX = r",\s*(?:seq|op_id|sizes|input_op_ids|stashed seq)\s*=.*$"
#: PyTorch's nested C++ namespaces before an op's own name (``autograd::engine::evaluate_function: X``,
#: ``torch::autograd::AccumulateGrad``): two or more levels are left out of a group's name (one, as ``aten::``,
#: says which library the op is from and stays), so that no word of it outgrows a table's name column.
_DEEP_NAMESPACE = r"^(?:\w+::){2,}"
_TRAILING_NUMBER = r"(?<=\D)\d+$"
_SEP = "\x1f"  # between domain and name in a group's key (a character no range name is expected to hold)
#: Sort keys of the console's range tables (``--sort``): column, and whether larger comes first.
SORT_KEYS = {"incl_ms": ("incl_ms", True), "excl_ms": ("excl_ms", True), "h2d": ("h2d_bytes", True),
             "d2h": ("d2h_bytes", True), "launches": ("launches", True), "calls": ("calls", True),
             "name": ("name", False)}
#: How the console names each sort key (its column's header).
SORT_LABELS = {"incl_ms": "incl ms", "excl_ms": "excl ms", "h2d": "H2D bytes", "d2h": "D2H bytes",
               "launches": "launches", "calls": "calls", "name": "name"}
DEFAULT_SORT, DEFAULT_TOP = "incl_ms", 15  # (a screen: <= 120 lines at 80 columns with both range tables)


def group_names(names: pd.Series, how: str = DEFAULT_GROUP_BY) -> pd.Series:
    """Each range name's group (:data:`GROUP_BY`), computed once per distinct name."""
    if how not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {how!r}")
    if isinstance(names.dtype, pd.CategoricalDtype):  # (millions of ranges, a few names: read once each)
        codes, uniques = names.cat.codes.to_numpy(), names.cat.categories.astype(str)
    else:
        codes, uniques = pd.factorize(names.astype(str), sort=False)
    groups = pd.Series(uniques, dtype=object)
    if how != "name":
        base = groups.str.replace(_EMIT_SUFFIX, "", regex=True)
        # (spaces around the name, taken off before its namespaces: "aten::mm ,seq = 1" is aten::mm, " x::y::z" is
        # z as "x::y::z" is, and a leading space reads as nesting on the console; a name of spaces or namespaces
        # alone stays itself)
        stripped = base.str.strip().str.replace(_DEEP_NAMESPACE, "", regex=True).str.strip()
        groups = stripped.where(stripped != "", base)
        if how == "numbered":
            groups = groups.str.replace(_TRAILING_NUMBER, "#", regex=True)
    # each instance's group as a code into the distinct groups (one string per group, not per instance)
    group_codes, distinct = pd.factorize(groups.to_numpy(object))
    # (a range with no name, code -1: no group; it took the last group's)
    grouped = np.append(group_codes, -1)[codes] if len(codes) else np.zeros(0, np.int64)
    return pd.Series(pd.Categorical.from_codes(grouped, pd.Index(distinct, dtype=object)), index=names.index)


def group_tree(instances: pd.DataFrame) -> pd.DataFrame:
    """Per (``domain``, ``group``) of ``instances`` (which carry ``group`` and ``parent``, the row position of each
    instance's parent or -1): ``parent_domain``/``parent_name`` (the group its instances most often sit in; ""
    at the top), ``level`` (how deep that nests, 0 at the top; a group found inside itself, as recursion makes,
    is not its own parent), ``parent_calls`` (its instances inside one of that group's, at any depth; for a group
    at the top, those inside no other group's: the rest sit elsewhere, and its totals hold them too) and
    ``within_parent`` (every instance sits directly in one of that group's, on the same GPUs: the group's bytes
    lie within that group's)."""
    cols = ["domain", "group", "parent_domain", "parent_name", "level", "parent_calls", "within_parent"]
    if not len(instances):
        return pd.DataFrame(columns=cols)
    from pcietrace.analysis.nesting import codes as row_codes
    from pcietrace.schema import by_object

    # each instance's (domain, group) as a number, in order of first appearance: no string per instance (a long
    # run's per-instance arrays as narrow as they can be)
    domain, group = (instances[c].cat.codes.to_numpy() if isinstance(instances[c].dtype, pd.CategoricalDtype)
                     else pd.factorize(instances[c].to_numpy(object) if instances[c].dtype == object else instances[c])[0]
                     for c in ("domain", "group"))
    key = row_codes(domain, group).astype(np.int32)
    del domain, group
    n_keys = int(key.max()) + 1
    first = np.flatnonzero(~pd.Series(key, copy=False).duplicated().to_numpy())  # (each key's first instance)
    parent = instances["parent"].to_numpy()
    parent = parent if parent.dtype.kind in "iu" else parent.astype(np.int64)
    up = np.where(parent >= 0, key[np.clip(parent, 0, None)], -1)  # (-1: at the top)
    # the group each key's instances most often sit in (ties: the one seen first), itself left out
    width = n_keys + 1  # (each (key, up) pair as one number, up from -1; pairs in order of first appearance)
    apart = key != up
    joined = key[apart].astype(np.int64)
    joined *= width
    joined += up[apart]
    joined += 1
    del apart
    pair, pairs = pd.factorize(joined)
    del joined
    counted = pd.DataFrame({"key": pairs // width, "up": pairs % width - 1, "n": np.bincount(pair, minlength=len(pairs)),
                            "seen": np.arange(len(pairs))})
    del pair
    best = counted.sort_values(["key", "n", "seen"], ascending=[True, False, True], kind="stable").drop_duplicates("key")
    parent_of = np.full(n_keys, -1, np.int64)
    parent_of[best["key"].to_numpy()] = best["up"].to_numpy()
    _cut_cycles(parent_of)
    # (a key whose every instance's direct parent is of that group, on the same GPUs: its calls lie in the parent
    # group's, and calls of one parent never overlap, so its bytes are within that group's)
    gpus = by_object(instances["gpus"].to_numpy(object))[0] if "gpus" in instances else np.zeros(key.size, np.int64)
    off = (parent < 0) | (up != parent_of[key]) | (gpus != gpus[np.clip(parent, 0, None)])
    within = np.bincount(key[off], minlength=n_keys) == 0
    del up, gpus, off
    parent_calls = np.bincount(key[_inside_parent_group(key, parent, parent_of)], minlength=n_keys)
    level = np.full(n_keys, -2, np.int64)  # (-2: not yet known)
    for k in range(n_keys):  # one step per group (not per range; no loop left: _cut_cycles)
        chain, cur = [], k
        while cur >= 0 and level[cur] == -2:
            chain.append(cur)
            cur = int(parent_of[cur])
        base = int(level[cur]) if cur >= 0 else -1
        for i, c in enumerate(reversed(chain)):
            level[c] = base + 1 + i
    names = {c: instances[c].iloc[first].to_numpy(object) for c in ("domain", "group")}
    top, up = parent_of < 0, np.clip(parent_of, 0, None)
    return pd.DataFrame({"domain": names["domain"], "group": names["group"],
                         "parent_domain": np.where(top, "", names["domain"][up]),
                         "parent_name": np.where(top, "", names["group"][up]), "level": level,
                         "parent_calls": parent_calls, "within_parent": within & ~top}, columns=cols)


def _inside_parent_group(key: np.ndarray, parent: np.ndarray, parent_of: np.ndarray) -> np.ndarray:
    """Per instance (``key``: its group's code; ``parent``: its parent's row, -1 at the top), whether one of its
    ancestors is a call of the group its group is placed under (``parent_of``; for a group at the top, -1:
    whether none of its ancestors is of another group). One step up per nesting level, every instance at once."""
    # (rows and codes in 32 bits: a long run's 1e7 instances walk in ~0.2 GB, not twice that)
    target = parent_of.astype(np.int32)[key]
    at_top = target < 0
    inside = np.zeros(key.size, bool)
    other = np.zeros(key.size, bool)  # (for groups at the top: an ancestor of another group)
    live = np.flatnonzero(parent >= 0).astype(np.int32)  # (the instances whose walk up goes on, and where each is)
    cur = parent[live].astype(np.int32)
    while live.size:
        above = key[cur]
        inside[live] |= above == target[live]
        other[live] |= above != key[live]
        cur = parent[cur]
        on = cur >= 0
        live, cur = live[on], cur[on]
    return np.where(at_top, ~other, inside)


def _cut_cycles(parent_of: np.ndarray) -> None:
    """``parent_of`` (each group's parent group, -1 at the top) with every loop of parents cut: groups that hold
    each other in turn (``encode`` in ``decode`` on some calls, ``decode`` in ``encode`` on others) would each sit
    under the other, and no tree holds them. The loop's first group (in order of first appearance) goes to the top.
    One step per group, not per range."""
    state = np.zeros(parent_of.size, np.int8)  # (0 not seen, 1 on the chain being walked, 2 done)
    for k in range(parent_of.size):
        chain, cur = [], k
        while cur >= 0 and state[cur] == 0:
            state[cur] = 1
            chain.append(cur)
            cur = int(parent_of[cur])
        if cur >= 0 and state[cur] == 1:  # (the walk came back to itself: a loop from cur)
            loop = chain[chain.index(cur):]
            parent_of[min(loop)] = -1
        state[chain] = 2


def select(ranges: pd.DataFrame, sort: str = DEFAULT_SORT, top: int | None = DEFAULT_TOP,
           pattern: str | None = None) -> tuple[pd.DataFrame, dict[str, int]]:
    """The rows of the ``ranges`` table a screen shows: those whose name matches ``pattern`` (a regular
    expression, searched; None: all), the first ``top`` by ``sort`` (:data:`SORT_KEYS`; None: all), in tree order
    (each under its parent group, siblings by ``sort``, ``indent`` levels deep) where the table carries
    ``parent_domain``/``parent_name``. Also how many rows and distinct names (``names``) were there, matched, and shown."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, not {sort!r}")
    col, descending = SORT_KEYS[sort]
    rg = ranges.assign(launches=ranges["eager_launches"].fillna(0) + ranges["graph_launches"].fillna(0)) \
        if len(ranges) else ranges.assign(launches=[])
    names_total = int(rg["names"].sum()) if "names" in rg else len(rg)
    if pattern:  # (searched once per name; a user's groups are theirs, not columns to extract)
        rx = re.compile(pattern)
        matched = rg[[bool(rx.search(str(n))) for n in rg["name"]]]
    else:
        matched = rg
    ranked = matched.sort_values(col, ascending=not descending, kind="stable", na_position="last")
    shown = ranked if top is None else ranked.head(top)
    if "parent_name" in shown and len(shown):
        shown = _tree_order(shown, ranked.index)
    info = {"ranges": len(rg), "names": names_total, "matched": len(matched), "shown": len(shown)}
    return shown.drop(columns="launches"), info


def _tree_order(shown: pd.DataFrame, rank: pd.Index) -> pd.DataFrame:
    """``shown`` as a tree: each row after its parent group's row (where shown), siblings in ``rank``'s order,
    with ``indent`` (levels below the nearest shown ancestor's; a row whose parent is not shown stands at 0)."""
    key = shown["domain"].astype(str) + _SEP + shown["name"].astype(str)
    up = shown["parent_domain"].fillna("").astype(str) + _SEP + shown["parent_name"].fillna("").astype(str)
    pos = {k: i for i, k in enumerate(key)}
    order = pd.Series(np.arange(len(rank)), index=rank).reindex(shown.index).to_numpy()
    children: dict[int, list[int]] = {}
    roots = []
    for i, p in enumerate(up):
        (children.setdefault(pos[p], []) if p in pos and pos[p] != i else roots).append(i)
    out: list[int] = []
    indent: list[int] = []
    seen = np.zeros(len(shown), bool)
    stack = [(i, 0) for i in sorted(roots, key=lambda i: order[i], reverse=True)]
    while True:
        while stack:  # depth first, siblings in rank order
            i, depth = stack.pop()
            if seen[i]:
                continue
            seen[i] = True
            out.append(i)
            indent.append(depth)
            stack.extend((j, depth + 1) for j in sorted(children.get(i, []), key=lambda j: order[j], reverse=True))
        if seen.all():
            return shown.iloc[out].assign(indent=indent)
        # (rows whose parents hold each other in a loop, as a table from before loops were cut can have: the
        # best ranked of them stands at the top)
        stack = [(min(np.flatnonzero(~seen), key=lambda i: order[i]), 0)]
