"""A new user's bad inputs found by trying every subcommand by hand (issue: no tracebacks): each case
here was a traceback, a wrong exit code or a silently ignored value before its fix."""

from __future__ import annotations

import pytest

from pcietrace.cli import main


def one_line_exit_2(argv: list[str], capsys) -> str:
    """Run the CLI in-process; assert exit 2 with exactly one line and no traceback; return the line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pcietrace: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("kernel_us", ["1", "1,2,3"])
def test_graphs_kernel_us_needs_exactly_min_and_max(kernel_us, capsys) -> None:
    # was: ValueError (unpacking) from GraphsPlan, a traceback
    assert "--kernel-us takes MIN,MAX" in one_line_exit_2(
        ["graphs", "--simulate", "--no-save", "--kernel-us", kernel_us], capsys)


@pytest.mark.parametrize("gpu", ["99", "-1"])
def test_graphs_simulate_refuses_a_gpu_it_does_not_have(gpu, capsys) -> None:
    # was: exit 0, the SIMULATED GPU 0 measured under the name the user asked for
    assert f"no CUDA device {gpu}" in one_line_exit_2(["graphs", "--simulate", "--no-save", "--gpu", gpu], capsys)
