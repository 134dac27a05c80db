"""The team guide's layering, checked mechanically on every module of the package (``pcietrace/`` and
``collectors/``, which imports as ``pcietrace.collectors``): collectors -> device -> record -> session ->
analysis -> report, lower layers never import higher ones, presentation (rich) only above analysis, and one
module each speaks to pynvml and to the ``cuda`` packages. Above them the library's front (config ->
workflow -> api) and the CLI built on it: cli/commands -> workflow -> record / analysis / report; the
commands record only through the workflow, and nothing but the CLI imports the CLI (the API never does).

An import counts wherever it is written: at the top, inside a function, under ``TYPE_CHECKING``, relative
(``from ..analysis import x``), or as ``importlib.import_module``/``__import__`` of a literal name (an
f-string counts by its literal start)."""

from __future__ import annotations

import ast
import functools

import pytest

from conftest import ROOT


def _module_name(rel: str) -> str:
    """``pcietrace/record/guard.py`` -> ``pcietrace.record.guard``; ``collectors/x.py`` -> ``pcietrace.collectors.x``."""
    parts = rel.removesuffix(".py").split("/")
    if parts[0] == "collectors":
        parts = ["pcietrace", *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _literal_prefix(arg: ast.expr) -> str | None:
    """The module a literal ``import_module`` argument names: the string, or an f-string's literal start up
    to its last dot (``f"pcietrace.report.{m}"`` -> ``pcietrace.report``)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rpartition(".")[0] or None
    return None


def imports_in(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import anywhere in ``source`` (the module ``module``). A
    ``from X import y`` gives ``X`` and ``X.y`` (``y`` may be a submodule: ``from pcietrace import analysis``)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            target = _literal_prefix(node.args[0]) if name in ("import_module", "__import__") else None
            if target:
                found.append((node.lineno, target))
    return found


@functools.lru_cache(maxsize=None)
def package_imports() -> dict[str, list[tuple[int, str]]]:
    """Every module's imports, keyed by its path relative to the checkout (``pcietrace/record/guard.py``)."""
    files = sorted([*(ROOT / "pcietrace").rglob("*.py"), *(ROOT / "collectors").glob("*.py")])
    out = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        out[rel] = imports_in(path.read_text(), _module_name(rel), path.name == "__init__.py")
    return out


def _names(target: str, name: str) -> bool:
    return name == target or name.startswith(target + ".")


LOW = ("pcietrace/record/", "pcietrace/device/", "collectors/")
#: The record/ modules that measure (the CLI reaches them through pcietrace.workflow only).
RECORDERS = ("run", "box", "parallel", "latency", "graphs", "generate", "node", "trace")
#: (rule, the modules it covers (path prefixes), the imports they may not make, the one module (or folder)
#: allowed them)
RULES = [
    ("a: no presentation (rich) below report/", ("pcietrace/analysis/", *LOW, "pcietrace/session.py"), ("rich",), None),
    ("b: record/, device/ and collectors/ import no analysis, report or command", LOW,
     ("pcietrace.analysis", "pcietrace.report", "pcietrace.commands", "pcietrace.cli"), None),
    ("c: analysis/ imports no report or command", ("pcietrace/analysis/",),
     ("pcietrace.report", "pcietrace.commands", "pcietrace.cli"), None),
    ("d: pynvml only in collectors/nvml.py", ("pcietrace/", "collectors/"), ("pynvml",), "collectors/nvml.py"),
    ("d: cuda.bindings and the other cuda packages only in device/cuda.py", ("pcietrace/", "collectors/"), ("cuda",),
     "pcietrace/device/cuda.py"),
    ("e: the library's front (api, config, workflow) imports no CLI",
     ("pcietrace/api.py", "pcietrace/config.py", "pcietrace/workflow.py", "pcietrace/__init__.py"),
     ("pcietrace.cli", "pcietrace.commands"), None),
    ("f: the CLI records through the workflow: no device, collector or recorder in cli.py or commands.py",
     ("pcietrace/cli.py", "pcietrace/commands.py"),
     ("pcietrace.device", "pcietrace.collectors", *(f"pcietrace.record.{m}" for m in RECORDERS),
      "pcietrace.record.attach.record_attach"), None),
    ("g: the configs load no pandas or numpy (the parser imports them)",
     ("pcietrace/config.py", "pcietrace/device/gpus.py"), ("pandas", "numpy"), None),
    ("h: the console is one renderer: no other report module imports it", ("pcietrace/report/",),
     ("pcietrace.report.console",), "pcietrace/report/console/"),
    ("i: report/ renders results, never makes them: no analyzer or session check", ("pcietrace/report/",),
     ("pcietrace.analysis.kinds", "pcietrace.analysis.validate", "pcietrace.analysis.analyze"), None),
    ("j: the console's shared parts (cells, system, the run's layout) and compare import no command's console",
     ("pcietrace/report/console/run.py", "pcietrace/report/console/compare.py", "pcietrace/report/console/system.py",
      "pcietrace/report/console/cells.py"),
     ("pcietrace.report.console.attach", "pcietrace.report.console.graphs", "pcietrace.report.console.compare",
      "pcietrace.report.console.run"), None),
]


def violations(rule: tuple, imports: dict[str, list[tuple[int, str]]]) -> list[str]:
    """``path:line imports NAME`` for every import ``rule`` forbids (one per line: the first name matched); the
    allowed module may be a folder (``pcietrace/report/console/``: every module in it)."""
    _, covered, forbidden, allowed = rule
    bad = {(rel, line): name for rel, found in imports.items()
           if rel.startswith(covered) and not (allowed and rel.startswith(allowed))
           for line, name in reversed(found) if any(_names(f, name) for f in forbidden)}
    return [f"{rel}:{line} imports {name}" for (rel, line), name in sorted(bad.items())]


@pytest.mark.parametrize("rule", RULES, ids=[r[0].split(":")[0] + "-" + r[2][0] for r in RULES])
def test_no_module_imports_across_its_layer(rule) -> None:
    imports = package_imports()
    assert any(rel.startswith(rule[1]) for rel in imports), f"rule {rule[0]!r} covers no module: the layout moved"
    found = violations(rule, imports)
    assert not found, f"rule {rule[0]}:\n" + "\n".join(found)


def test_only_the_cli_imports_the_cli() -> None:
    """Every module but the CLI's own (and ``python -m pcietrace``'s entry) is below it: the library works
    without it, and the API calls the workflow, never a command."""
    cli = ("pcietrace/cli.py", "pcietrace/commands.py", "pcietrace/__main__.py")
    found = [f"{rel}:{line} imports {name}" for rel, names in package_imports().items() if rel not in cli
             for line, name in names if _names("pcietrace.cli", name) or _names("pcietrace.commands", name)]
    assert not found, "\n".join(found)
    assert any(_names("pcietrace.workflow", n) for _, n in package_imports()["pcietrace/api.py"])
    assert any(_names("pcietrace.workflow", n) for _, n in package_imports()["pcietrace/commands.py"])


def test_the_check_sees_imports_inside_functions_and_the_allowed_modules_use_theirs() -> None:
    """Not vacuous: the lazy imports of the two allowed modules (inside functions) are found, and every
    folder of the package was read."""
    imports = package_imports()
    assert "pynvml" in {n for _, n in imports["collectors/nvml.py"]}
    assert "cuda.bindings" in {n for _, n in imports["pcietrace/device/cuda.py"]}
    assert {rel.split("/")[1] for rel in imports if rel.startswith("pcietrace/") and rel.count("/") == 2} >= {
        "analysis", "device", "record", "report"}
    assert "pcietrace.report.console.run" in {n for _, n in imports["pcietrace/report/console/attach.py"]}


@pytest.mark.parametrize("source,module,expected", [
    ("def f():\n    from rich.console import Console\n", "pcietrace.record.guard", "rich.console"),
    ("from ..analysis import to_jsonable\n", "pcietrace.record.guard", "pcietrace.analysis.to_jsonable"),
    ("from . import nvml\n", "pcietrace.collectors.sampler", "pcietrace.collectors.nvml"),
    ("from pcietrace import report\n", "pcietrace.analysis.x", "pcietrace.report"),
    ("import importlib\nimportlib.import_module(f'pcietrace.report.{m}')\n", "pcietrace.analysis.x", "pcietrace.report"),
    ("if TYPE_CHECKING:\n    import cuda.bindings.driver as drv\n", "pcietrace.record.run", "cuda.bindings.driver"),
])
def test_each_way_of_importing_is_seen(source, module, expected) -> None:
    assert expected in {n for _, n in imports_in(source, module)}


def test_a_module_named_like_a_forbidden_package_is_not_one() -> None:
    """``pcietrace.device.cuda`` (the GPU object) is not the ``cuda`` package: importing it is no violation."""
    source = "from pcietrace.device import cuda\nfrom . import cuda_x\n"
    found = {"pcietrace/record/box.py": imports_in(source, "pcietrace.record.box")}
    assert violations(RULES[-1], found) == []


def test_the_plots_do_not_import_the_console() -> None:
    """Rule e covers plots.py (matplotlib figures borrow no rich table's words: both read report/labels.py)."""
    names = {n for _, n in package_imports()["pcietrace/report/plots.py"]}
    assert "pcietrace.report.labels" in names and not any(_names("pcietrace.report.console", n) for n in names)


def test_a_rule_s_allowed_folder_covers_its_modules_only() -> None:
    rule = next(r for r in RULES if r[0].startswith("h:"))
    found = {"pcietrace/report/console/attach.py": [(1, "pcietrace.report.console.run")],
             "pcietrace/report/plots.py": [(3, "pcietrace.report.console.cells")]}
    assert violations(rule, found) == ["pcietrace/report/plots.py:3 imports pcietrace.report.console.cells"]
