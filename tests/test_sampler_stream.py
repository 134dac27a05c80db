"""collectors/sampler.py's stream to disk: what a sampler's parent streamed reads back whole up to a cut anywhere
in the file (a crash mid-write), and the parent flushes on time, not only on size, so a crash loses at most
:data:`~pcietrace.collectors.sampler.FLUSH_S` of samples however slowly they come."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pcietrace.collectors import sampler


def _frame(start: int, n: int) -> pd.DataFrame:
    return pd.DataFrame({"nvml_index": np.zeros(n, np.int64), "t_ns": np.arange(start, start + n, dtype=np.int64),
                         "read_ns": np.ones(n, np.int64), "tx_raw": np.arange(n, dtype=np.uint64),
                         "rx_raw": np.arange(n, dtype=np.uint64)})


def test_a_stream_cut_anywhere_reads_back_its_whole_batches(tmp_path) -> None:
    stream = sampler.SampleStream(tmp_path)
    for k in range(4):
        stream.write(_frame(100 * k, 100))
    whole = (tmp_path / sampler.STREAM_FILE).read_bytes()
    written = pd.concat([_frame(100 * k, 100) for k in range(4)], ignore_index=True)
    pd.testing.assert_frame_equal(sampler.read_stream(tmp_path), written)
    got = set()
    for cut in range(0, len(whole), 13):
        (tmp_path / sampler.STREAM_FILE).write_bytes(whole[:cut])
        df = sampler.read_stream(tmp_path)
        assert len(df) % 100 == 0 and (df["t_ns"].to_numpy() == np.arange(len(df))).all()
        got.add(len(df))
    assert got == {0, 100, 200, 300}
    assert len(sampler.read_stream(tmp_path / "none")) == 0


def test_the_parent_flushes_every_flush_period_however_few_samples_come(tmp_path, monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(sampler.time, "monotonic", lambda: clock[0])
    s = sampler.CounterSampler([0], spill_dir=tmp_path)
    for k in range(10):  # a slow GPU: 5 samples a chunk, a chunk every 0.3 s
        clock[0] += 0.3
        f = _frame(5 * k, 5)
        s._take((0, f["t_ns"].to_numpy(), f["read_ns"].to_numpy(), f["tx_raw"].to_numpy(), f["rx_raw"].to_numpy()))
        on_disk = len(sampler.read_stream(tmp_path))
        assert 5 * (k + 1) - on_disk <= 5 * sampler.FLUSH_S / 0.3 + 5  # (held: at most a flush period's)
    assert s._stream.batches >= 2 and len(s.frame()) == 50
