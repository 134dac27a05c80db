import sys


def run() -> int:
    """The ``pcietrace`` command (pyproject's script) and ``python -m pcietrace``: Ctrl-C while Python is still
    importing the command line says one line, with no traceback."""
    try:
        from pcietrace.cli import main
    except KeyboardInterrupt:
        print("pcietrace: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":  # guard: the sampler's spawned child re-imports the main module
    sys.exit(run())
