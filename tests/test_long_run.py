"""A long attach run's outputs stay bounded: range instances to Parquet (``report --instances``, and a saved run
past :data:`pcietrace.session.INLINE_INSTANCES`), and the benchmark's synthetic recordings load and analyse.
Speed and memory are bench/long_run.py's (laws, not timed tests)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import long_run
from golden import recordings


@pytest.mark.parametrize("folder", [f for f in recordings() if (f / "events.parquet").exists()][:6],
                         ids=lambda p: p.name)
def test_instances_to_parquet_hold_the_table(folder, tmp_path, capsys) -> None:
    """``report --instances FILE``: the table's rows in FILE, the JSON naming it and the row count."""
    import pcietrace
    from pcietrace.cli import main

    assert main(["report", str(folder), "--format", "json", "--instances", str(tmp_path / "i.parquet")]) == 0
    doc = json.loads(capsys.readouterr().out)
    inst = pcietrace.load(folder).range_instances
    assert doc["results"]["range_instances"] == {"parquet": str(tmp_path / "i.parquet"), "rows": len(inst)}
    back = pd.read_parquet(tmp_path / "i.parquet")
    assert list(back.columns) == list(inst.columns) and len(back) == len(inst)
    for c in ("t_start_ns", "h2d_bytes", "name", "status"):
        pd.testing.assert_series_equal(back[c], inst[c].reset_index(drop=True), check_dtype=False)
    assert [list(g) for g in back["gpus"]] == [list(g) for g in inst["gpus"]]


def test_instances_refuse_the_recordings_own_files(copy, capsys) -> None:
    from conftest import one_line_exit_2

    folder = copy("attach_h100_python")
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    assert "the report's own events.parquet" in one_line_exit_2(
        ["report", str(folder), "--instances", str(folder / "events.parquet")], capsys)
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before


def test_instances_go_to_any_name_the_file_system_takes(tmp_path, capsys) -> None:
    """A file name that is not UTF-8 (Arrow's own open refused it: a traceback) is written as any file is."""
    import os

    import pcietrace
    from pcietrace.cli import main

    from conftest import DATA

    target = tmp_path / os.fsdecode(b"inst\xff.parquet")
    assert main(["report", str(DATA / "attach_h200_serve"), "--instances", str(target)]) == 0
    with open(target, "rb") as f:
        assert len(pd.read_parquet(f)) == len(pcietrace.load(DATA / "attach_h200_serve").range_instances)


def test_perfetto_and_instances_are_never_one_file(tmp_path, capsys) -> None:
    """Both outputs named alike: the second written replaced the first (the instances' Parquet held the trace)."""
    from conftest import DATA, one_line_exit_2

    line = one_line_exit_2(["report", str(DATA / "attach_h200_serve"), "--perfetto", str(tmp_path / "out"),
                            "--instances", str(tmp_path / "x" / ".." / "out")], capsys)
    assert "give each a file of its own" in line and not (tmp_path / "out").exists()


def test_a_saved_run_past_the_inline_limit_keeps_its_instances_in_parquet(data_dir, tmp_path, monkeypatch) -> None:
    from pcietrace import session as session_module
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import saved_tables
    from pcietrace.session import INSTANCES_FILE, Session

    s = Session.load(data_dir / "attach_h100_blind")
    res = analyze(s)
    monkeypatch.setattr(session_module, "INLINE_INSTANCES", len(res["range_instances"]) - 1)
    s.save(tmp_path / "run", saved_tables(res))
    doc = json.loads((tmp_path / "run" / "report.json").read_text())
    assert doc["results"]["range_instances"] == {"parquet": INSTANCES_FILE, "rows": len(res["range_instances"])}
    assert len(pd.read_parquet(tmp_path / "run" / INSTANCES_FILE)) == len(res["range_instances"])
    assert doc["results"]["ranges"] and Session.load(tmp_path / "run").meta == s.meta  # still a recording
    monkeypatch.setattr(session_module, "INLINE_INSTANCES", len(res["range_instances"]))
    s.save(tmp_path / "small", saved_tables(res))  # at the limit: inline, as before
    doc = json.loads((tmp_path / "small" / "report.json").read_text())
    assert len(doc["results"]["range_instances"]) == len(res["range_instances"])


def test_the_synthetic_long_run_is_a_recording_of_its_size(tmp_path) -> None:
    """bench/long_run.py's recording: one process per GPU, about the ranges and samples asked for, each
    process's ranges charged to its own GPU."""
    import pcietrace

    long_run.synthesise(tmp_path / "r", gpus=3, samples=30_000, ranges=3_000, names=50)
    run = pcietrace.load(tmp_path / "r")
    inst = run.range_instances
    assert run.session.samples.groupby("nvml_index").size().to_dict() == {0: 10_000, 1: 10_000, 2: 10_000}
    assert 3_000 <= len(inst) < 3_000 + 3 * 464 and inst["pid"].nunique() == 3
    assert (inst.groupby("pid")["gpus"].agg(lambda g: {tuple(x) for x in g}).map(len) == 1).all()
    assert inst["name"].nunique() <= 50 * 8 and (inst["status"] == "ok").mean() > 0.9
    assert np.isfinite(run.whole_run["h2d_bytes"]).all()


def test_spilled_samples_come_back_whole(tmp_path, monkeypatch) -> None:
    """A sampler with a spill folder holds at most SPILL_ROWS samples and gives back the same frame as one that
    kept them all (chunks as the sampler processes send them)."""
    from pcietrace.collectors import sampler

    monkeypatch.setattr(sampler, "SPILL_ROWS", 1_000)
    rng = np.random.default_rng(0)
    kept, spilled = sampler.CounterSampler([0, 1]), sampler.CounterSampler([0, 1], spill_dir=tmp_path)
    t = {0: 0, 1: 5}
    for k in range(60):
        i = k % 2
        n = int(rng.integers(50, 150))
        ts = t[i] + np.cumsum(rng.integers(400_000, 600_000, n))
        t[i] = int(ts[-1])
        chunk = (i, ts.astype(np.int64), rng.integers(1e5, 3e5, n).astype(np.int64),
                 np.cumsum(rng.integers(0, 1e6, n)).astype(np.uint64), np.cumsum(rng.integers(0, 1e6, n)).astype(np.uint64))
        kept._take(chunk)
        spilled._take(chunk)
        assert spilled._held < 1_000 + 150
    assert spilled._stream.batches >= 4
    pd.testing.assert_frame_equal(spilled.frame(), kept.frame())


def test_the_sampler_processes_spill_as_they_go() -> None:
    """The real CounterSampler (spawned sampler processes, a stand-in counter reader: no driver here) with a
    spill folder: every sample comes back, in order, while the parent held few at a time.
    (bench: the 10-minute, 8-sampler version of the memory figure.)"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "tests" / "apps" / "sampler_spill_fake_nvml.py"), "2", "2"],
                          cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["gpus"] == [0, 1] and res["in_order"]
    assert res["files"] >= 1 and res["held"] < res["samples"]  # (how many: the machine's load decides)


def test_parquet_is_written_a_row_group_at_a_time_and_a_write_cut_short_leaves_no_file(data_dir, tmp_path,
                                                                                        monkeypatch) -> None:
    """Samples, events and range instances go to Parquet a row group at a time (never all in Arrow at once): a
    real recording's events read back the same; a write cut short (here: at its second group) leaves neither the
    file nor a partial one behind."""
    import pyarrow.parquet as pq

    from pcietrace import session
    from pcietrace.session import Session

    events = Session.load(data_dir / "attach_h100_python").events
    monkeypatch.setattr(session, "ROWS_PER_GROUP", max(len(events) // 3, 1))
    session.write_parquet(events, tmp_path / "events.parquet")
    assert pq.ParquetFile(tmp_path / "events.parquet").metadata.num_row_groups >= 3
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "events.parquet"), events, check_dtype=False,
                                  check_categorical=False)

    class CutShort(pq.ParquetWriter):
        def write_table(self, table, *args, **kwargs):
            if getattr(self, "_written", 0):
                raise KeyboardInterrupt
            self._written = 1
            return super().write_table(table, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetWriter", CutShort)
    with pytest.raises(KeyboardInterrupt):
        session.write_parquet(events, tmp_path / "cut.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet"]


@pytest.mark.parametrize("failing", ["range_instances.parquet", "samples.parquet", "events.parquet"])
def test_a_save_whose_writer_fails_raises_its_error_and_writes_no_report(data_dir, tmp_path, monkeypatch,
                                                                         failing) -> None:
    """The Parquet files are written at once (threads): an error in any one of them is the save's, and no
    report.json or partial file is left (the run is never published as whole)."""
    from pcietrace import session as session_module
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import saved_tables
    from pcietrace.session import Session

    s = Session.load(data_dir / "attach_h100_blind")
    res = analyze(s)
    monkeypatch.setattr(session_module, "INLINE_INSTANCES", len(res["range_instances"]) - 1)
    real = session_module._to_parquet

    def to_parquet(df, path, **options):
        if path.name == failing:
            raise OSError(28, "No space left on device")
        return real(df, path, **options)

    monkeypatch.setattr(session_module, "_to_parquet", to_parquet)
    with pytest.raises(OSError, match="No space left"):
        s.save(tmp_path / "run", saved_tables(res))
    left = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert "report.json" not in left and failing not in left and not [n for n in left if "partial" in n or "tmp" in n]


def test_events_hold_their_small_counts_in_8_or_16_bits_and_their_identifiers_in_32(tmp_path) -> None:
    """A real recording's events as loaded: depths, device ordinals and captured counts in 8 or 16 bits (within a
    quarter of its range), pids, thread and range ids never below 32 bits (code adds offsets to them), every value
    the same as read whole."""
    import pyarrow.parquet as pq

    from pcietrace.schema import SMALL_INTS
    from pcietrace.session import Session

    from conftest import DATA

    rec = DATA / "attach_h100_emit_nvtx"
    events = Session.load(rec).events
    whole = pq.read_table(rec / "events.parquet").to_pandas()
    for c in SMALL_INTS:
        v = whole[c].to_numpy()
        quarter = 2 ** (events[c].dtype.itemsize * 8 - 2)
        assert events[c].dtype.itemsize <= 2 and -quarter <= v.min() and v.max() < quarter
        assert (events[c].to_numpy() == v).all()
    for c in ("pid", "tid", "id"):
        assert events[c].dtype.itemsize >= 4 and (events[c].to_numpy() == whole[c].to_numpy()).all()


@pytest.mark.parametrize("folder", ["attach_h100_emit_nvtx", "attach_h200x8_torchrun", "attach_h100_blind_graphs"])
def test_an_analysis_that_releases_the_events_gives_the_same_result(folder) -> None:
    """`report` lets the events go once the ranges are made and the samples once read (a long run's events and
    samples are not held beside its instances): every result table the same as an analysis that keeps them, and
    the session's events and samples left empty with their columns."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    from conftest import DATA

    kept, released = Session.load(DATA / folder), Session.load(DATA / folder)
    a, b = analyze(kept), analyze(released, release_events=True, release_samples=True)
    for raw in ("events", "samples"):
        assert len(getattr(kept, raw)) and not len(getattr(released, raw))
        assert list(getattr(released, raw).columns) == list(getattr(kept, raw).columns)
    for name, table in a.items():
        if isinstance(table, pd.DataFrame):
            pd.testing.assert_frame_equal(table, b[name], check_exact=True)
        else:
            assert table == b[name]


@pytest.mark.parametrize("folder", ["attach_h200x8_torchrun", "attach_h200x2_torchrun_outside",
                                    "attach_h200x4_quiet_split"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["by_process", "interleaved"])
def test_ranges_made_a_process_at_a_time_are_the_same(folder, interleaved) -> None:
    """:func:`process_ranges` (one process's events at a time, and taking the events apart as it goes) gives the
    rows, columns, types and categories of :func:`ranges_from_events` and :func:`range_gpus` over every event at
    once; with each process's events together in the frame and with them interleaved in time."""
    from pcietrace.analysis import attribution, gpu_time
    from pcietrace.session import Session

    from conftest import DATA

    s = Session.load(DATA / folder)
    events = gpu_time.host_events(s.events)
    order = np.argsort(events["t_ns"].to_numpy(), kind="stable") if interleaved else \
        np.argsort(pd.factorize(events["pid"])[0], kind="stable")
    events = events.iloc[order].reset_index(drop=True)
    assert events["pid"].nunique() > 1
    gpus = s.meta["gpus"]
    whole = attribution.range_gpus(attribution.ranges_from_events(events), events, gpus)
    pd.testing.assert_frame_equal(attribution.process_ranges(events, gpus), whole, check_exact=True)
    taken = events.copy()
    pd.testing.assert_frame_equal(attribution.process_ranges(taken, gpus, consume=True), whole, check_exact=True)
    assert not len(taken.columns)  # (taken apart)


def test_events_let_go_before_the_save_are_saved_from_their_file(copy, tmp_path) -> None:
    """attach writes the events into its staging folder and lets them go once the ranges are made: the run saved
    there, or anywhere else, holds them whole, and loads to the same results."""
    from pcietrace.analysis import analyze
    from pcietrace.report.saved import saved_tables
    from pcietrace.session import EVENTS_FILE, Session

    folder = copy("attach_h200x8_torchrun")
    s = Session.load(folder)
    events = s.events.copy()
    (tmp_path / "run").mkdir()
    s.events_file = tmp_path / "run" / EVENTS_FILE
    results = analyze(s, release_events=True)
    assert not len(s.events) and s.events_file.is_file()
    for where in (tmp_path / "run", tmp_path / "elsewhere"):
        s.save(where, saved_tables(results))
        back = Session.load(where)
        pd.testing.assert_frame_equal(back.events, events, check_exact=True)
        assert back.meta == Session.load(folder).meta
    again = analyze(Session.load(tmp_path / "elsewhere"))
    pd.testing.assert_frame_equal(again["range_instances"], results["range_instances"], check_exact=True)


@pytest.mark.parametrize("folder", ["attach_h100_decode/decode-eager-gputime", "attach_h100_slowed/cpp-slowed-eager",
                                    "attach_h200x8_torchrun"])
def test_savings_worked_out_a_chunk_at_a_time_are_the_same(folder, monkeypatch) -> None:
    """:func:`savings.predict_ms` works out a long run's instances a chunk at a time, and children's sums are added
    a chunk at a time (:func:`nesting.children_sum`): chunks of a few rows give the same predictions and
    launch-boundness as one chunk (with and without the GPU's busy time)."""
    from pcietrace.analysis import analyze, nesting, savings
    from pcietrace.session import Session

    from conftest import DATA

    inst = analyze(Session.load(DATA / folder))["range_instances"]
    costs = Session.load(DATA / folder).meta["launch_costs"]
    whole = savings.predict_ms(inst, costs)
    monkeypatch.setattr(savings, "PREDICT_CHUNK", 7)
    monkeypatch.setattr(nesting, "CHUNK", 5)
    pd.testing.assert_frame_equal(savings.predict_ms(inst, costs), whole, check_exact=True)


@pytest.mark.parametrize("folder", ["attach_h200x8_torchrun", "attach_h200x2_threads", "attach_h100_python"])
def test_samples_read_a_gpu_at_a_time_give_the_same_result(folder) -> None:
    """`report` leaves an attach run's samples in their file and reads them a GPU at a time: every result table
    the same as with the samples held."""
    from pcietrace.analysis import analyze
    from pcietrace.session import Session

    from conftest import DATA

    held, on_disk = Session.load(DATA / folder), Session.load(DATA / folder, samples_on_disk=True)
    assert on_disk.sample_file is not None and not len(on_disk.samples)
    assert {g: n for g, (_, n) in on_disk.sample_file.gpus.items()} == held.samples["nvml_index"].value_counts().to_dict()
    a, b = analyze(held), analyze(on_disk)
    for name, table in a.items():
        if isinstance(table, pd.DataFrame):
            pd.testing.assert_frame_equal(table, b[name], check_exact=True)
        else:
            assert table == b[name]


@pytest.mark.parametrize("change", [
    lambda s, at: s.assign(tx_raw=s["tx_raw"].astype(float).where(s.index != at + 7)),
    lambda s, at: s.assign(rx_raw=s["rx_raw"].astype(np.int64).where(s.index != at + 9, -5)),
    lambda s, at: s.assign(rx_raw=s["rx_raw"].astype(np.uint64).where(s.index != at + 3, np.uint64(2**33))),
    lambda s, at: s.assign(t_ns=s["t_ns"].where(s.index != at + 11, s["t_ns"].iloc[at])),
], ids=["nan", "negative", "beyond", "back_in_time"])
def test_broken_samples_read_a_gpu_at_a_time_are_refused_alike(copy, change) -> None:
    """A broken sample of the second GPU is refused with the same words (row, column, GPU) whether the samples
    are held or read from their file a GPU at a time."""
    from pcietrace.analysis import analyze
    from pcietrace.errors import DataError
    from pcietrace.session import Session

    from conftest import edit_samples

    run = copy("attach_h200x2_threads")
    at = int((Session.load(run).samples["nvml_index"] == 0).sum())  # (GPU 1's first row)
    edit_samples(run, lambda s: change(s, at))
    said = []
    for on_disk in (False, True):
        s = Session.load(run, samples_on_disk=on_disk)
        assert (s.sample_file is not None) == on_disk
        with pytest.raises(DataError) as err:
            analyze(s)
        said.append(str(err.value))
    assert said[0] == said[1], said
    assert "GPU 1" in said[0] or any(f"row {at + k}" in said[0] for k in (3, 7, 9)), said


def test_samples_not_by_gpu_are_held(copy) -> None:
    """A samples file whose rows are not by GPU (not as pcietrace saves them) is read whole."""
    from pcietrace.session import Session

    from conftest import edit_samples

    run = copy("attach_h200x2_threads")
    edit_samples(run, lambda s: s.sort_values("t_ns", kind="stable"))
    s = Session.load(run, samples_on_disk=True)
    assert s.sample_file is None and len(s.samples)


def test_a_gpu_s_samples_are_its_own_whatever_columns_come_before_them(tmp_path) -> None:
    """A samples file with nested columns before ``nvml_index`` (not as pcietrace writes them): Parquet numbers
    the statistics by leaf column, so a field's place is not its statistics' (a GPU read whole from groups that
    another column's statistics said held only it returned another GPU's row), and a nested leaf's path can be
    a top-level column's name. SIMULATED: made by hand."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pcietrace.session import SampleFile

    def group(gpus: list[int], b: list[int]) -> pa.Table:
        nested = pa.StructArray.from_arrays([pa.array([9] * len(gpus)), pa.array(b)], ["a", "b"])
        # (a top-level column whose name is a nested leaf's path: each keeps its own statistics)
        dotted, nvml = pa.array([10**12] * len(gpus)), pa.StructArray.from_arrays([pa.array(b)], ["index"])
        return pa.table({"nvml.index": dotted, "nvml": nvml, "s": nested, "nvml_index": pa.array(gpus),
                         "t_ns": pa.array(range(10, 10 + len(gpus)))})

    path = tmp_path / "samples.parquet"
    parts = [group([0], [1]), group([0, 1], [0, 3]), group([1], [5])]  # (the leaf "s.b" spans 1 ... 5: not a GPU)
    with pq.ParquetWriter(path, parts[0].schema) as w:
        for t in parts:
            w.write_table(t)
    f = SampleFile.open(path)
    assert f is not None and f.gpus == {0: (0, 2), 1: (2, 2)}
    for gpu in (0, 1):
        got = f.read(gpu)
        assert got["nvml_index"].tolist() == [gpu, gpu] and got["nvml.index"].tolist() == [10**12] * 2


def test_a_sample_file_damaged_after_it_was_opened_is_one_line(copy, capsys) -> None:
    """A samples file that breaks after `report` opened it (a GPU's row groups unreadable or changed) is said in
    one line naming the file, not a traceback."""
    from pcietrace.analysis import analyze
    from pcietrace.errors import ReportError
    from pcietrace.session import Session

    run = copy("attach_h200x2_threads")
    s = Session.load(run, samples_on_disk=True)
    data = (run / "samples.parquet").read_bytes()
    (run / "samples.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ReportError, match="samples.parquet"):
        analyze(s)


@pytest.mark.parametrize("folder", ["attach_h200x8_torchrun", "attach_h200x4_dense"])
def test_objects_factorized_a_chunk_at_a_time_are_the_same(folder, monkeypatch) -> None:
    """:func:`pcietrace.schema.by_object` reads a long run's ``gpus`` lists a chunk at a time: chunks of a few rows
    give the codes and distinct lists of one chunk, in first-seen order, and the console cleans them alike."""
    from pcietrace import schema
    from pcietrace.analysis import analyze
    from pcietrace.report.text import clean_frame
    from pcietrace.session import Session

    from conftest import DATA

    inst = analyze(Session.load(DATA / folder))["range_instances"]
    values = inst["gpus"].to_numpy(object)
    codes, distinct = schema.by_object(values)
    monkeypatch.setattr(schema, "BY_OBJECT_CHUNK", 3)
    small_codes, small_distinct = schema.by_object(values)
    np.testing.assert_array_equal(small_codes, codes)
    assert small_codes.dtype == codes.dtype and [id(v) for v in small_distinct] == [id(v) for v in distinct]
    assert len(distinct) > 1  # (several GPUs' lists)
    assert [values[i] is distinct[codes[i]] for i in range(len(values))] == [True] * len(values)
    pd.testing.assert_frame_equal(clean_frame(inst), inst, check_exact=True)


@pytest.mark.parametrize("step", [1, 2, -1])
def test_object_identities_are_ids_however_the_array_is_laid_out(step) -> None:
    """:func:`pcietrace.schema.by_object` reads a contiguous object array's identities from its buffer, and any
    other's one ``id`` at a time: both give each value's ``id`` (shared lists, other objects, None)."""
    from pcietrace import schema

    shared = [[0], [1, 2], None, "x"]
    values = np.array([shared[i % 4] if i % 3 else [i] for i in range(1000)] + [None], object)[::step]
    assert values.flags.c_contiguous == (step == 1)
    np.testing.assert_array_equal(schema._identities(values), [id(v) for v in values])
    codes, distinct = schema.by_object(values)
    assert all(values[i] is distinct[codes[i]] for i in range(len(values)))
    assert schema._identities(values[:0]).size == 0
