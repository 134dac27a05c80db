"""pcietrace.config: one validated config per measuring command. A bad value raises a ConfigError naming the
field (the Python API's words); the CLI says the flag the user typed instead, in one line, exit 2."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import one_line_exit_2
from pcietrace.cli import build_parser, flag
from pcietrace.config import AttachConfig, GraphsConfig, LatencyConfig, RunConfig
from pcietrace.errors import ConfigError, UsageError

CONFIGS = {"run": RunConfig, "latency": LatencyConfig, "graphs": GraphsConfig, "attach": AttachConfig}


@pytest.mark.parametrize("make, field", [
    (lambda: RunConfig(window_s=0), "window_s"),
    (lambda: RunConfig(window_s=float("nan")), "window_s"),
    (lambda: RunConfig(sample_interval_ms=-1), "sample_interval_ms"),
    (lambda: RunConfig(durations_us=(0, 2e6)), "durations_us"),
    (lambda: RunConfig(durations_us="0,x"), "durations_us"),
    (lambda: RunConfig(graph_ks=(1.5,)), "graph_ks"),
    (lambda: RunConfig(graph_ks=(0,)), "graph_ks"),
    (lambda: RunConfig(contexts=17), "contexts"),
    (lambda: RunConfig(repeats=2), "repeats"),
    (lambda: RunConfig(us_per_level=0), "us_per_level"),
    (lambda: RunConfig(gpus=2), "gpus"),
    (lambda: RunConfig(simulate=True, gpus=65), "gpus"),
    (lambda: RunConfig(seed=-1), "seed"),
    (lambda: RunConfig(gpu="0,0"), "gpu"),
    (lambda: LatencyConfig(gpu="zero"), "gpu"),
    (lambda: AttachConfig(command=("true",), gpu=[0, "1"]), "gpu"),
    (lambda: LatencyConfig(repeats=True), "repeats"),
    (lambda: LatencyConfig(gpus=3), "gpus"),
    (lambda: GraphsConfig(kernels=(0,)), "kernels"),
    (lambda: GraphsConfig(param_sets=0), "param_sets"),
    (lambda: GraphsConfig(order="sometimes"), "order"),
    (lambda: GraphsConfig(strategies="recognize"), "strategies"),
    (lambda: GraphsConfig(strategies=("eager", "magic")), "strategies"),
    (lambda: GraphsConfig(kernel_us=(1,)), "kernel_us"),
    (lambda: GraphsConfig(iterations=1), "iterations"),
    (lambda: GraphsConfig(rounds=0), "rounds"),
    (lambda: GraphsConfig(iterations=10**9), "iterations"),
    (lambda: GraphsConfig(gpu="0,1"), "gpu"),
    (lambda: GraphsConfig(sample_interval_ms=float("inf")), "sample_interval_ms"),
    (lambda: AttachConfig(), "command"),
    (lambda: AttachConfig(command="python train.py"), "command"),
    (lambda: AttachConfig(command=("true",), sampler_duty=0), "sampler_duty"),
    (lambda: AttachConfig(command=("true",), idle_sample_interval_ms=21), "idle_sample_interval_ms"),
    (lambda: AttachConfig(command=("true",), quiet_sample_interval_ms=-1), "quiet_sample_interval_ms"),
    (lambda: AttachConfig(command=("true",), idle_s=0), "idle_s"),
    (lambda: AttachConfig(command=("true",), launch_counter="nvtx"), "launch_counter"),
    (lambda: AttachConfig(command=("true",), group_by="op_id"), "group_by"),
    (lambda: AttachConfig(command=("true",), max_depth=0), "max_depth"),
    (lambda: AttachConfig(command=("true",), max_depth=4097), "max_depth"),
    (lambda: AttachConfig(command=("true",), max_depth=True), "max_depth"),
    (lambda: AttachConfig(command=("true",), max_depth=1.5), "max_depth"),
])
def test_each_bad_value_names_its_field(make, field) -> None:
    with pytest.raises(ConfigError) as exc:
        make()
    assert exc.value.field == field and str(exc.value).startswith(f"{field} ")
    assert "--" not in str(exc.value)  # the API's words: fields, never flags
    assert isinstance(exc.value, UsageError)  # (callers that catch usage errors keep catching these)


def test_a_message_names_other_fields_by_the_callers_names() -> None:
    err = ConfigError("gpus", "needs {simulate} (real GPUs are chosen with {gpu})")
    assert str(err) == "gpus needs simulate (real GPUs are chosen with gpu)"
    assert err.say(flag) == "--gpus needs --simulate (real GPUs are chosen with --gpu)"


@pytest.mark.parametrize("command", sorted(CONFIGS))
def test_every_field_the_cli_sets_is_named_by_one_of_its_flags(command) -> None:
    """:func:`pcietrace.cli.flag` names, for every config field, a flag the command's parser has: an error
    on any field is said in the user's words."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    options = {o for a in sub._actions for o in a.option_strings}
    unset = {("attach", "save")}  # attach always saves: no --no-save
    for f in dataclasses.fields(CONFIGS[command]):
        if (command, f.name) in unset:
            continue
        if f.name == "command":
            assert any(a.dest == "cmd" for a in sub._actions)
            continue
        assert flag(f.name) in options, (command, f.name, flag(f.name))


@pytest.mark.parametrize("argv, said", [
    (["run", "--gpus", "2", "--no-save"], "--gpus simulates a box of N GPUs: it needs --simulate"),
    (["latency", "--gpus", "2", "--no-save"], "(real GPUs are chosen with --gpu)"),
    (["run", "--simulate", "--gpu", "x", "--no-save"], "--gpu takes 'all' or CUDA device numbers"),
    (["graphs", "--simulate", "--no-save", "--param-sets", "0"], "--param-sets must be 1..10000"),
    (["graphs", "--simulate", "--no-save", "--iterations", "1"], "--iterations must be at least 2 per window"),
    (["graphs", "--simulate", "--no-save", "--iterations", "100000", "--rounds", "20"],
     "--iterations x --rounds must be at most"),
    (["graphs", "--simulate", "--no-save", "--strategies", "recognize"], "--strategies must include eager"),
    (["attach", "--gpu", "0"], "-- CMD is empty: attach needs a program to run"),
])
def test_the_cli_says_the_flag_of_the_field(argv, said, capsys) -> None:
    line = one_line_exit_2(argv, capsys)
    assert said in line and "Traceback" not in line


def test_configs_are_frozen_and_sequences_become_tuples() -> None:
    c = RunConfig(simulate=True, durations_us="0,5", graph_ks=[1.0, 10])
    assert c.durations_us == (0.0, 5.0) and c.graph_ks == (1, 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.window_s = 1.0  # type: ignore[misc]
    g = GraphsConfig(strategies="eager, recognize", kernels=[20])
    assert g.strategies == ("eager", "recognize") and g.plan().strategies == ("eager", "recognize")
    assert AttachConfig(command=["python3", "-c", "pass"]).command == ("python3", "-c", "pass")


def test_quick_gives_its_defaults_and_a_value_given_wins() -> None:
    quick = RunConfig(quick=True).plan()
    full = RunConfig().plan()
    assert quick.window_s < full.window_s and len(quick.durations_us) < len(full.durations_us)
    assert quick.e2e_repeats < full.e2e_repeats
    mixed = RunConfig(quick=True, window_s=0.25, contexts=2).plan()
    assert mixed.window_s == 0.25 and mixed.durations_us == quick.durations_us and mixed.gpu_time_contexts == 2


def test_the_limits_the_configs_copy_to_stay_light_agree_with_their_sources() -> None:
    """config.py loads no pandas or numpy, so it names a few limits again: they agree with the modules that
    own them."""
    from pcietrace import config
    from pcietrace.analysis import names
    from pcietrace.collectors import sampler
    from pcietrace.schema import NO_LAUNCH_COUNTER

    assert config.GROUP_BY == names.GROUP_BY and names.DEFAULT_GROUP_BY == AttachConfig.group_by
    assert config.MAX_IDLE_INTERVAL_MS * 1e6 == sampler.MAX_IDLE_INTERVAL_NS
    assert NO_LAUNCH_COUNTER in config.LAUNCH_COUNTERS
