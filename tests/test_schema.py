"""The one validated load path (pcietrace/schema.py, Session.load): a damaged, incomplete or newer report -- a
parquet file cut, garbage or missing, a key missing or mistyped, JSON nested too deep -- is a ReportError naming the
file and field, one line and exit 2 at the CLI. On copies of the real recordings in tests/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pcietrace.errors import ReportError, UsageError
from pcietrace.session import Session

from conftest import DATA, edit_report, one_line_exit_2


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_parquet_is_one_line(copy, capsys, damage) -> None:
    run = copy()
    f = run / "samples.parquet"
    raw = f.read_bytes()
    f.write_bytes({"truncate": raw[: len(raw) // 2], "garbage": os.urandom(len(raw)), "empty": b""}[damage])
    err = one_line_exit_2(["report", str(run)], capsys)
    assert "samples.parquet" in err


def test_damaged_events_parquet_is_one_line(copy, capsys) -> None:
    run = copy("attach_h100_python")
    (run / "events.parquet").write_bytes(b"PAR1" + b"\x00" * 50)
    assert "events.parquet" in one_line_exit_2(["report", str(run)], capsys)


@pytest.mark.parametrize("change, field", [
    (lambda d: d["meta"].pop("gpus"), "meta.gpus"),
    (lambda d: d["meta"]["gpus"][0].update(nvml_index="0"), "meta.gpus[0].nvml_index"),
    (lambda d: d["meta"]["gpus"][0].update(nvml_index=None), "meta.gpus[0].nvml_index"),
    (lambda d: d["meta"].update(gpus={}), "meta.gpus"),
    (lambda d: d["meta"]["gpus"][0].update(counter={"mode": 3, "bits": 32}), "meta.gpus[0].counter.mode"),
    (lambda d: d["meta"].update(simulated="no"), "meta.simulated"),
    (lambda d: d.update(tables=[]), "report.tables"),
    (lambda d: d["tables"]["windows"][0].update(t_start_ns="soon"), "windows.t_start_ns"),
    (lambda d: [w.pop("purpose") for w in d["tables"]["windows"]], "windows.purpose"),
    (lambda d: d["tables"]["bursts"][3].update(saturated=None), "bursts.saturated"),
    (lambda d: d["meta"].update(topology={"gpus": [{"bdf": 1}]}), "meta.topology.gpus[0].bdf"),
])
def test_missing_or_mistyped_keys_name_the_field(copy, capsys, change, field) -> None:
    run = copy()
    edit_report(run, change)
    with pytest.raises(ReportError, match=field.replace("[", r"\[").replace("]", r"\]")) as exc:
        Session.load(run)
    assert "report.json" in str(exc.value) or ".parquet" in str(exc.value)
    one_line_exit_2(["report", str(run)], capsys)


def test_deep_json_nesting_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / "report.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in one_line_exit_2(["report", str(tmp_path)], capsys)


def test_binary_report_json_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / "report.json").write_bytes(b"\xff\xfe\x00garbage")
    one_line_exit_2(["report", str(tmp_path)], capsys)


def test_newer_schema_says_so(copy, capsys) -> None:
    run = copy()
    edit_report(run, lambda d: d.update(schema="pcietrace.report/2"))
    assert "newer pcietrace" in one_line_exit_2(["report", str(run)], capsys)


def test_report_without_samples_file_is_one_line(copy, capsys) -> None:
    run = copy()
    (run / "samples.parquet").unlink()
    assert "samples.parquet is missing" in one_line_exit_2(["report", str(run)], capsys)


def test_report_errors_are_usage_errors() -> None:
    """ReportError is a UsageError: every existing `except UsageError` and the CLI's exit 2 still apply."""
    with pytest.raises(UsageError, match="no pcietrace report"):
        Session.load(Path("/nonexistent/run"))


@pytest.mark.parametrize("name", ["attach_h100_python", "h100_run"])
def test_a_gpu_listed_twice_in_meta_is_refused(name, copy, capsys) -> None:
    # was (attach): ValueError 'truth value of a Series is ambiguous', a traceback
    folder = copy(name)
    edit_report(folder, lambda doc: doc["meta"]["gpus"].append(dict(doc["meta"]["gpus"][0])))
    assert "meta.gpus[1].nvml_index: GPU 0 is listed twice" in one_line_exit_2(["report", str(folder)], capsys)


def test_a_graphs_report_without_its_plan_is_refused(copy, capsys) -> None:
    # was: ValueError "Unknown format code 'g' for object of type 'str'" (the '?' placeholders), a traceback
    folder = copy("graphs_h100")
    edit_report(folder, lambda doc: doc["meta"].pop("graphs_plan"))
    assert "meta.graphs_plan: missing" in one_line_exit_2(["report", str(folder)], capsys)


@pytest.mark.parametrize("column", ["eager_launches", "prep_ns"])
def test_graphs_columns_the_analysis_reads_are_checked(column, copy, capsys) -> None:
    # was: ValueError from int('x...') summing the counts, or a KeyError for a dropped column, a traceback
    folder = copy("graphs_h100")
    edit_report(folder, lambda doc: [r.__setitem__(column, "x") for r in doc["tables"]["graphs"]])
    assert f"graphs.{column}: expected 64-bit numbers" in one_line_exit_2(["report", str(folder)], capsys)
    edit_report(folder, lambda doc: [r.pop(column) for r in doc["tables"]["graphs"]])
    assert f"graphs.{column}: missing column" in one_line_exit_2(["report", str(folder)], capsys)


def test_json_lines_are_the_records_pandas_writes_with_floats_kept_floats() -> None:
    """Every kind of column a result table holds, written a column at a time, reads back as pandas' own records
    do (NaN, NA and infinities null; counts as integers), each float still a float."""
    import json

    import numpy as np
    import pandas as pd

    from pcietrace.schema import counts_as_ints, json_lines

    shared = [0, 1]
    df = pd.DataFrame({
        "pid": np.array([7, 8, 9, 10], np.int64), "eager_launches": [1.0, np.nan, 3.0, 4.0],
        "h2d_bytes": [2.0, np.nan, np.inf, 1234567.8912345678], "incl_ms": [-0.0, 1e20, 1e-7, 0.1],
        "closed": [True, False, True, True], "name": ['a "q"\n', "é", "x\\y", "a \"q\"\n"],
        "gpus": [shared, shared, [np.int64(2)], []], "launch_bound": [True, np.nan, False, None],
        "group": pd.Categorical(["s", "t", "s", None]), "level": pd.array([0, None, 2, 3], "Int64"),
        "small": np.array([-120, 120, 0, 5], np.int8), "big": np.array([2**63, 2**63 + 2, 2**63, 2**63], np.uint64),
        "mixed": np.array([True, 1, 1.0, -0.0], object), "flag": pd.array([True, None, False, True], "boolean")})
    df = counts_as_ints(df)
    mine = [json.loads(line) for line in json_lines(df)]
    theirs = json.loads(df.to_json(orient="records"))
    assert mine == theirs
    assert all(isinstance(r["incl_ms"], float) for r in mine) and isinstance(mine[0]["h2d_bytes"], float)
    assert isinstance(mine[0]["eager_launches"], int) and mine[1]["eager_launches"] is None
    assert json_lines(df, sep=",\n") == ",\n".join(json_lines(df))
    assert json_lines(df.iloc[:0]) == [] and json_lines(df.iloc[:0], sep=",") == ""
    # values pandas takes for one (True, 1 and 1.0; 0.0 and -0.0) each keep their own text
    assert [json.loads(line)["mixed"] for line in json_lines(df)] == [True, 1, 1.0, -0.0]
    assert [line.split('"mixed":')[1].split(",")[0] for line in json_lines(df)] == ["true", "1", "1.0", "-0.0"]
    assert json_lines(df[[]]) == ["{}"] * 4 and json_lines(df[[]], sep=",") == ",".join(["{}"] * 4)


def test_a_table_written_to_a_file_is_the_text_written_to_a_string(tmp_path, monkeypatch) -> None:
    """write_json hands a text file's bytes the rows as Arrow made them (a long run's instances: gigabytes of
    text), a string buffer the decoded text; both read back as the same document, whole floats among fractional
    ones and all-whole float columns keeping their decimal point, across chunks (a file's made on threads, more
    of them than threads, written in order)."""
    import io
    import json

    import numpy as np
    import pandas as pd

    from pcietrace import schema

    monkeypatch.setattr(schema, "JSON_CHUNK_ROWS", 3)  # (several chunks from a small table)
    n = 40
    df = pd.DataFrame({"pid": np.arange(n), "whole_ns": np.arange(n) * 2.0, "h2d_bytes": np.arange(n) / 3,
                       "name": pd.Categorical(["é"] * n), "closed": np.arange(n) % 2 == 0})
    doc = {"head": {"x": 1}, "range_instances": df}
    text = io.StringIO()
    schema.write_json(doc, text)
    path = tmp_path / "doc.json"
    with open(path, "w") as f:
        f.write("{\"before\": 1, \"doc\": ")  # (text written before the rows: flushed ahead of them)
        schema.write_json(doc, f)
        f.write("}")
    assert path.read_text(encoding="utf-8") == "{\"before\": 1, \"doc\": " + text.getvalue() + "}"
    wide = tmp_path / "utf16.json"  # (a stream that is not UTF-8 gets the rows as text)
    with open(wide, "w", encoding="utf-16") as f:
        schema.write_json(doc, f)
    assert wide.read_text(encoding="utf-16") == text.getvalue()
    rows = json.loads(text.getvalue())["range_instances"]
    assert [r["whole_ns"] for r in rows] == [2.0 * i for i in range(n)] and isinstance(rows[1]["whole_ns"], float)
    assert '"whole_ns":2.0' in text.getvalue() and rows[4]["name"] == "é"


def test_columns_of_few_values_written_together_are_the_text_of_each_column_alone(monkeypatch) -> None:
    """Adjacent columns of few values are written from the text of each combination of their values, made once
    for the table (runs split where the combinations pass the limit), with the keys around them folded in, and a
    float column from an earlier one's text where their values are the same (exclusive bytes: the bytes of a range
    with no children): the same text as every column written on its own, in every chunk of rows, on a real
    recording's instances with NaN, NA, a missing category and a column of mostly whole numbers added."""
    import numpy as np
    import pandas as pd

    from pcietrace import api, schema

    inst = api.load(DATA / "attach_h100_emit_nvtx").range_instances
    inst = schema.counts_as_ints(inst.iloc[:300].copy())
    inst["depth"] = inst["depth"] - 3  # (negative values among the few)
    inst.loc[inst.index[::7], "h2d_bytes"] = np.nan
    inst["eager_launches"] = pd.array(inst["eager_launches"].where(inst.index % 11 > 0), "Int64")
    inst["group"] = inst["group"].cat.add_categories(["never seen"]).where(inst.index % 13 > 0)
    inst["excl_again_ns"] = inst["excl_ns"].where(inst.index % 5 > 0, 0.5)  # (like a column of whole numbers)
    runs = schema.RowTexts(inst, ",\n")
    assert any(isinstance(p, schema._Run) and len(p.sizes) > 2 for p in runs.parts)  # (columns written together)
    floats = [p for p in runs.parts if isinstance(p, schema._Floats)]

    def like(column: str) -> np.ndarray | None:  # (the values of the column whose text it takes)
        part = next(p for p in floats if np.array_equal(p.values, inst[column], equal_nan=True))
        return runs.parts[part.like].values if part.like is not None else None

    assert np.array_equal(like("excl_h2d_bytes"), inst["h2d_bytes"], equal_nan=True)
    assert np.array_equal(like("excl_again_ns"), inst["excl_ns"])
    lines = schema.json_lines(inst)
    chunks = [bytes(runs.joined(lo, min(lo + 64, len(inst)))).decode() for lo in range(0, len(inst), 64)]
    monkeypatch.setattr(schema, "JSON_COMBINATIONS", 1)  # (each column on its own)
    monkeypatch.setattr(schema, "JSON_INT_SPAN", 0)  # (every integer cast)
    monkeypatch.setattr(schema, "JSON_LIKE_SHARE", 2.0)  # (every float cast)
    alone = schema.json_lines(inst)
    assert lines == alone and ",\n".join(chunks) == ",\n".join(alone)
    assert all(len(p.sizes) == 1 for p in schema.RowTexts(inst, None).parts if isinstance(p, schema._Run))
    monkeypatch.setattr(schema, "JSON_COMBINATIONS", 12)  # (runs split where their combinations pass 12)
    assert schema.json_lines(inst) == alone
    monkeypatch.setattr(schema, "JSON_COMBINATIONS", 1 << 16)
    monkeypatch.setattr(schema, "JSON_COMBINATION_BYTES", 1 << 16)  # (a long text among few values: not in many)
    inst.insert(inst.columns.get_loc("depth"), "long", pd.Categorical(np.where(inst.index % 2, "x" * 50_000, "y")))
    made = schema.RowTexts(inst, None)
    runs = [p for p in made.parts if isinstance(p, schema._Run)]
    assert [2] in [p.sizes for p in runs] and all(p.texts.nbytes < 1 << 16 for p in runs if len(p.sizes) > 1)
    monkeypatch.setattr(schema, "JSON_COMBINATION_BYTES", 1 << 40)
    assert schema.json_lines(inst) == [r.as_py() for r in made.texts(0, len(inst))]
    assert max(p.texts.nbytes for p in schema.RowTexts(inst, None).parts if isinstance(p, schema._Run)) > 1 << 20
