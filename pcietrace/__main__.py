import sys

try:
    from pcietrace.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python is still importing: one line, no traceback
    print("pcietrace: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":  # guard: the sampler's spawned child re-imports the main module
    sys.exit(main())
