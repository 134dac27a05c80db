"""docs/report.schema.json, the JSON Schema of a saved report.json, is derived from pcietrace/schema.py (the
checks `pcietrace report` and `pcietrace.load` enforce) and accepts the real recordings in tests/data.

Regenerate it after changing pcietrace/schema.py:  python3 tests/test_report_schema.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from pcietrace import schema

from conftest import ROOT

SCHEMA_FILE = ROOT / "docs" / "report.schema.json"

_COLUMN = {"int": {"type": "integer"}, "pos": {"type": "integer", "minimum": 1}, "num": {"type": ["number", "null"]},
           "str": {"type": ["string", "null"]}, "bool": {"type": "boolean"}}


def _cells(check: Any) -> dict[str, Any]:
    return dict(zip(check.__code__.co_freevars, (c.cell_contents for c in check.__closure__ or ())))


#: The JSON Schema of each of pcietrace.schema's leaf checks, by the name it gives in its errors; a leaf not
#: named here is documented by its name and constrains nothing.
_LEAVES = {"a 64-bit integer": {"type": "integer"}, "a number": {"type": "number"},
           "a finite number >= 0": {"type": "number", "minimum": 0}, "a string": {"type": "string"},
           "true or false": {"type": "boolean"},
           "a number of ms in 0..60000": {"type": "number", "minimum": 0, "maximum": 60000},
           "[MIN, MAX] finite numbers": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
           "an exit code in 0..255": {"type": "integer", "minimum": 0, "maximum": 255},
           "a count >= 0": {"type": "integer", "minimum": 0}}


def to_json_schema(check: Any) -> dict[str, Any]:
    """The JSON Schema of one of pcietrace.schema's checks (read from the closures that build it)."""
    code, cells = check.__code__, _cells(check)
    if code is schema._type("", bool).__code__:
        return dict(_LEAVES.get(cells["name"], {"description": cells["name"]}))
    if code is schema.opt(schema.INT).__code__:
        inner = to_json_schema(cells["check"])
        return {"anyOf": [inner, {"type": "null"}]}
    if code is schema.list_of(schema.INT).__code__:
        return {"type": "array", "items": to_json_schema(cells["check"])}
    if code is schema.obj({}).__code__:
        required, optional = cells["required"], cells["optional"] or {}
        out: dict[str, Any] = {"type": "object"}
        props = {k: to_json_schema(c) for k, c in {**required, **optional}.items()}
        if props:
            out["properties"] = props
        if required:
            out["required"] = list(required)
        return out
    raise TypeError(f"no JSON Schema for {check!r}")


def derived_schema() -> dict[str, Any]:
    doc = to_json_schema(schema.DOC)
    doc["properties"]["schema"] = {"type": "string", "const": schema.SCHEMA}
    def rows(cols: dict[str, str]) -> dict[str, Any]:
        return {"type": "array", "items": {"type": "object", "properties": {c: _COLUMN[k] for c, k in cols.items()},
                                           "required": list(cols)}}

    tables = {name: rows(cols) for name, cols in schema.TABLE_COLUMNS.items()
              if name not in ("samples", "events", "windows")}  # (samples and events are Parquet files)
    tables["windows"] = rows(schema.WINDOW_COLUMNS)  # the columns every kind has (run and graphs add their own)
    doc["properties"]["tables"]["properties"] = tables
    doc["properties"]["tables"]["additionalProperties"] = {"type": "array", "items": {"type": "object"}}
    # a result table: its records, or where a long run wrote them beside report.json, that file and its rows
    beside = {"type": "object", "properties": {"parquet": {"type": "string"}, "rows": {"type": "integer"}},
              "required": ["parquet", "rows"]}
    doc["properties"]["results"] = {"type": "object", "additionalProperties": {
        "anyOf": [{"type": "array", "items": {"type": "object"}}, beside]}}
    kind_rules = [("attach", schema.ATTACH_META), ("graphs", schema.GRAPHS_META)]
    doc["allOf"] = [{"if": {"properties": {"meta": {"properties": {"kind": {"const": kind}}, "required": ["kind"]}}},
                     "then": {"properties": {"meta": to_json_schema(check)}}} for kind, check in kind_rules]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://github.com/pcietrace/pcietrace/docs/report.schema.json",
            "title": "pcietrace saved report (report.json)",
            "description": ("A run folder's report.json: metadata, the small recorded tables and the results as "
                            "analysed when saved. Counter samples and NVTX events are Parquet files beside it. "
                            "Derived from pcietrace/schema.py by tests/test_report_schema.py; unknown extra keys "
                            "are allowed. Table columns: integers have no nulls; numbers and strings may be null."),
            **doc}


def _recordings() -> list[Path]:
    return sorted(p for p in (ROOT / "tests" / "data").rglob("report.json"))


def _check(value: Any, sch: dict[str, Any], where: str) -> None:
    """A small validator for the subset of JSON Schema the file uses, for when jsonschema is not installed."""
    if "anyOf" in sch:
        errors = []
        for s in sch["anyOf"]:
            try:
                return _check(value, s, where)
            except AssertionError as e:
                errors.append(e)
        raise AssertionError(f"{where}: {errors}")
    kinds = sch.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    ok = {"object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
          "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
          "integer": lambda v: isinstance(v, int) and not isinstance(v, bool)
          or isinstance(v, float) and math.isfinite(v) and v == int(v),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert not kinds or any(ok[k](value) for k in kinds), f"{where}: {value!r} is not {kinds}"
    if "const" in sch:
        assert value == sch["const"], where
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert value >= sch.get("minimum", -math.inf) and value <= sch.get("maximum", math.inf), where
    if isinstance(value, dict):
        for key in sch.get("required", []):
            assert key in value, f"{where}.{key}: missing"
        for key, v in value.items():
            sub = sch.get("properties", {}).get(key, sch.get("additionalProperties"))
            if isinstance(sub, dict):
                _check(v, sub, f"{where}.{key}")
        for rule in sch.get("allOf", []):
            try:
                _check(value, rule["if"], where)
            except AssertionError:
                continue
            _check(value, rule["then"], where)
    if isinstance(value, list) and "items" in sch:
        assert sch.get("minItems", 0) <= len(value) <= sch.get("maxItems", math.inf), where
        for i, v in enumerate(value):
            _check(v, sch["items"], f"{where}[{i}]")


def test_the_schema_file_is_derived_from_schema_py() -> None:
    assert json.loads(SCHEMA_FILE.read_text()) == derived_schema(), "run: python3 tests/test_report_schema.py"


def test_every_key_schema_py_declares_is_in_the_file() -> None:
    meta = json.loads(SCHEMA_FILE.read_text())["properties"]["meta"]
    assert {"gpus", "kind", "status", "topology", "processes", "graphs_plan"} <= set(meta["properties"])
    assert meta["required"] == ["gpus"]
    gpu = meta["properties"]["gpus"]["items"]
    assert gpu["required"] == ["nvml_index"] and "cuda_ordinal" in gpu["properties"]


@pytest.mark.parametrize("report", _recordings(), ids=lambda p: str(p.parent.relative_to(ROOT / "tests" / "data")))
def test_recordings_are_valid(report: Path) -> None:
    doc, sch = json.loads(report.read_text()), json.loads(SCHEMA_FILE.read_text())
    _check(doc, sch, "report")
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(doc, sch, cls=jsonschema.Draft202012Validator)


def test_a_table_saved_beside_the_report_is_valid() -> None:
    doc = json.loads((ROOT / "tests" / "data" / "attach_h100_python" / "report.json").read_text())
    doc["results"]["range_instances"] = {"parquet": "range_instances.parquet", "rows": 123}  # as a long run saves it
    _check(doc, json.loads(SCHEMA_FILE.read_text()), "report")


@pytest.mark.parametrize("damage", ["no gpus", "gpu index a string", "schema of another tool", "attach without times"])
def test_damaged_reports_are_refused(damage: str) -> None:
    doc = json.loads((ROOT / "tests" / "data" / "attach_h100_python" / "report.json").read_text())
    if damage == "no gpus":
        del doc["meta"]["gpus"]
    elif damage == "gpu index a string":
        doc["meta"]["gpus"][0]["nvml_index"] = "0"
    elif damage == "schema of another tool":
        doc["schema"] = "other/1"
    else:
        del doc["meta"]["t_app_start_ns"]
    with pytest.raises(AssertionError):
        _check(doc, json.loads(SCHEMA_FILE.read_text()), "report")
    with pytest.raises(schema.Invalid):  # and schema.py refuses it too
        schema.check_doc(doc)


if __name__ == "__main__":
    SCHEMA_FILE.write_text(json.dumps(derived_schema(), indent=1) + "\n")
    sys.exit(0)
